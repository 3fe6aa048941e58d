"""Values passed between the asyncio side and an engine thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from kinfer.chat.template import RenderedPrompt
from kinfer.embedding import EmbedRequest
from kinfer.engines.base import GenerationJob
from kinfer.protocol import ChatRequest


@dataclass(frozen=True)
class PreparedJob:
    """A request rendered and tokenized (in its own task, off the engine thread), ready to take a row."""

    job: GenerationJob
    rendered: RenderedPrompt
    prompt_tokens: int


@dataclass
class Admission:
    """A prepared request on its way to a row: the engine thread only queues its token ids."""

    request: ChatRequest
    job_id: str
    prepared: PreparedJob
    enqueued_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class EmbedWork:
    """Embed every input of one request (`inputs`: their token ids, tokenized in the request's task);
    `reply` gets (vectors, tokens per input) or the error. `progress(inputs_done, tokens_done)` is
    called on the event loop after each pass that advanced it."""

    request: EmbedRequest
    job_id: str
    inputs: tuple[tuple[int, ...], ...]
    reply: Future  # concurrent.futures.Future[tuple[list[np.ndarray], list[int]]]
    progress: Callable[[int, int], None]


@dataclass(frozen=True)
class Cancel:
    job_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = Admission | EmbedWork | Cancel | Shutdown
