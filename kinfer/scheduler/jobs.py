"""Values passed between the asyncio side and an engine thread."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from kinfer.chat.template import RenderedPrompt
from kinfer.engines.base import GenerationJob
from kinfer.protocol import ChatRequest


@dataclass(frozen=True)
class PreparedJob:
    """A request rendered and tokenized on the engine thread, ready to take a row."""

    job: GenerationJob
    rendered: RenderedPrompt
    prompt_tokens: int


@dataclass
class Admission:
    """A request waiting to be rendered on the engine thread."""

    request: ChatRequest
    job_id: str
    enqueued_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Measure:
    """Render and tokenize without generating (token counting); answered through `reply`."""

    request: ChatRequest
    reply: Future  # concurrent.futures.Future[PreparedJob]


@dataclass(frozen=True)
class Cancel:
    job_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = Admission | Measure | Cancel | Shutdown
