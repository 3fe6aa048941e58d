"""One embedding request's life on the asyncio side, shown in the dashboard's live view and request
log beside the chat requests (it offers what they read of a `RequestStream`)."""

from __future__ import annotations

import time

from kinfer.embedding import EmbedRequest
from kinfer.protocol import FinishReason, Timings
from kinfer.scheduler.stream import RequestSnapshot, RequestState


class EmbedTicket:
    """Progress of one embedding request: inputs and tokens embedded so far."""

    generated = 0  # an embedding generates nothing
    reused = 0

    def __init__(self, request: EmbedRequest, job_id: str, model: str) -> None:
        self.request = request
        self.job_id = job_id
        self.model = model
        self.state: RequestState = "embedding"
        self.created = time.monotonic()
        self.inputs = len(request.inputs)
        self.inputs_done = 0
        self.prompt_tokens = 0  # known once every input is tokenized
        self.prompt_processed = 0
        self.dimensions = 0
        self.load_seconds = 0.0
        self.finish: FinishReason | None = None
        self.finished_at: float | None = None

    def on_progress(self, inputs_done: int, tokens_done: int) -> None:
        self.inputs_done = max(self.inputs_done, inputs_done)
        self.prompt_processed = max(self.prompt_processed, tokens_done)

    def on_done(self, tokens: int, dimensions: int) -> None:
        self.inputs_done = self.inputs
        self.prompt_tokens = self.prompt_processed = tokens
        self.dimensions = dimensions
        self._end("stop", "done")

    def on_error(self, cancelled: bool) -> None:
        self._end("cancelled" if cancelled else "error", "done" if cancelled else "failed")

    def _end(self, finish: FinishReason, state: RequestState) -> None:
        if self.finish is None:
            self.finish, self.state, self.finished_at = finish, state, time.monotonic()

    def timings(self, now: float | None = None) -> Timings:
        end = self.finished_at or now or time.monotonic()
        total = end - self.created
        return Timings(load=self.load_seconds, prompt=max(0.0, total - self.load_seconds), total=total)

    def snapshot(self, now: float) -> RequestSnapshot:
        tail = f"embed {self.inputs_done}/{self.inputs} inputs"
        if self.dimensions:
            tail += f" -> {self.dimensions} dims"
        return RequestSnapshot(
            request_id=self.request.request_id or self.job_id,
            dialect=self.request.dialect,
            model=self.model,
            state=self.state,
            prompt_tokens=self.prompt_tokens,
            prompt_processed=self.prompt_processed,
            generated=0,
            reused=0,
            tokens_per_second=0.0,
            age=now - self.created,
            tail=tail,
            finish=self.finish,
        )
