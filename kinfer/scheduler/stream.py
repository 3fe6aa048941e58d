"""One request's life on the asyncio side: engine updates in, dialect-neutral events out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Literal

from kinfer.chat.pipeline import OutputPipeline
from kinfer.engines.base import JobUpdate
from kinfer.errors import EngineFailure
from kinfer.protocol import (
    ChatRequest,
    Delta,
    Done,
    ErrorEvent,
    Event,
    FinishReason,
    Timings,
    TokenLogprob,
    Usage,
)
from kinfer.scheduler.jobs import PreparedJob

RequestState = Literal["queued", "prefill", "decoding", "embedding", "done", "failed"]
TAIL_CHARS = 120
# one choice's whole reply: (text, thinking, tool calls, its Done)
Collected = tuple[str, str, list, Done]


@dataclass(frozen=True)
class RequestSnapshot:
    """One row of the live batch, for the dashboard and /metrics."""

    request_id: str
    dialect: str
    model: str
    state: RequestState
    prompt_tokens: int
    prompt_processed: int
    generated: int
    reused: int
    tokens_per_second: float
    age: float
    tail: str
    finish: FinishReason | None
    choices: int = 1  # n: the request's replies, decoding side by side (generated counts them all)


class RequestStream:
    """Events for one request. Iterate it; call `cancel()` when the client goes away.

    A request for n choices is one stream: each choice has its own output pipeline and its own
    `Done` (events carry `choice`), and the stream ends once every choice has ended, or at the first
    error (the scheduler then cancels the other choices' rows)."""

    def __init__(
        self,
        request: ChatRequest,
        job_id: str,
        model: str,
        *,
        on_cancel: Callable[[str], None],
        arrived: float | None = None,
    ) -> None:
        """`arrived`: when the request reached the scheduler (monotonic), before any model load."""
        self.request = request
        self.job_id = job_id
        self.model = model
        self.state: RequestState = "queued"
        self.created = time.monotonic() if arrived is None else arrived
        self.prompt_tokens = 0
        self.prompt_processed = 0
        self.reused = 0
        self.generated = 0
        self.finish: FinishReason | None = None  # set once every choice has ended (choice 0's reason)
        self.choices = max(1, request.n)
        self._choice_finish: list[FinishReason | None] = [None] * self.choices
        self.finished_at: float | None = None
        self.load_seconds = 0.0
        self.context: tuple[int, ...] | None = None  # prompt + reply token ids, when the request asked
        self._tail = ""
        self.deadline_hit = False  # set when the generation deadline cancels this reply
        self._first_token_at: float | None = None
        self._prefill_started: float | None = None
        self._pipelines: list[OutputPipeline] = []
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._on_cancel = on_cancel
        self._moved = asyncio.Event()  # set whenever the state may have left "queued"
        self._queued_error: Exception | None = None  # the error, when it came before a row
        # per choice: logprobs of tokens whose text the pipeline has not released yet (they go on the
        # choice's next Delta)
        self._pending_logprobs: list[list[TokenLogprob]] = [[] for _ in range(self.choices)]
        # per choice: those of the answer text, gathered by `collect` / `collect_choices`
        self.choice_logprobs: list[list[TokenLogprob]] = [[] for _ in range(self.choices)]

    # ---- fed by the scheduler on the event loop -----------------------------------------

    def on_ready(self, prepared: PreparedJob) -> None:
        rendered = prepared.rendered
        self.prompt_tokens = prepared.prompt_tokens
        self._pipelines = [
            OutputPipeline(
                rendered.traits, starts_in_thinking=rendered.starts_in_thinking, tools=self.request.tools
            )
            for _ in range(self.choices)
        ]

    def on_admitted(self, reused: int = 0) -> None:
        """The job took a row, adopting `reused` prompt tokens from the prefix pool: prefill starts now.

        From here the cached/fresh split of the prompt is known (Anthropic's `message_start` says it)."""
        if reused:
            self.reused = reused
        if self._prefill_started is None:
            self._prefill_started = time.monotonic()
        if self.state == "queued":
            self.state = "prefill"
        self._moved.set()

    def on_update(self, update: JobUpdate) -> None:
        now = time.monotonic()
        if update.prompt_processed:
            if self._prefill_started is None:
                self._prefill_started = now
            self.prompt_processed = update.prompt_processed
            self.state = "prefill" if self.prompt_processed < self.prompt_tokens else "decoding"
        if update.reused_tokens:
            self.reused = update.reused_tokens
        if update.new_tokens:
            if self._first_token_at is None:
                self._first_token_at = now
                self.prompt_processed = self.prompt_tokens
            self.generated += update.new_tokens
            self.state = "decoding"
        choice = update.choice if 0 <= update.choice < self.choices else 0
        self._pending_logprobs[choice].extend(update.logprobs)
        if update.text and self._pipelines:
            if choice == 0:
                self._tail = (self._tail + update.text)[-TAIL_CHARS:]
            self._emit(choice, self._pipelines[choice].feed(update.text))
        if update.finish == "error" and update.error is not None:
            # the engine ended the row and says why (a grammar dead end): the client gets an error
            self.on_error(EngineFailure(update.error))
        elif update.finish is not None:
            self._finish(choice, update.finish, now, update.stop_string)
        self._moved.set()

    def _emit(self, choice: int, events: list[Event]) -> None:
        """Queue a choice's events; a Delta carries the logprobs of the choice's tokens generated up to
        its text."""
        pending = self._pending_logprobs[choice]
        for event in events:
            if isinstance(event, Delta) and pending:
                event = replace(event, logprobs=tuple(pending))
                pending.clear()
            self._events.put_nowait(replace(event, choice=choice) if choice else event)

    def unfinished_choices(self) -> list[int]:
        return [c for c, reason in enumerate(self._choice_finish) if reason is None]

    def on_error(self, error: Exception) -> None:
        if self.finish is not None:
            return
        if self.state == "queued":
            self._queued_error = error
        self.state = "failed"
        self.finish = "error"
        self.finished_at = time.monotonic()
        self._events.put_nowait(ErrorEvent(error))
        self._moved.set()

    def running_for(self, now: float) -> float:
        """Seconds since the request took a row."""
        return now - self._prefill_started if self._prefill_started is not None else 0.0

    def _finish(self, choice: int, reason: FinishReason, now: float, stop_string: str | None = None) -> None:
        if self.finish is not None or self._choice_finish[choice] is not None:
            return
        detail = None
        if reason == "cancelled" and self.deadline_hit:
            reason, detail = "deadline", "the reply reached the server's generation deadline"
        if self._pipelines:
            pipeline = self._pipelines[choice]
            self._emit(choice, pipeline.finish())
            if reason == "stop" and pipeline.tool_calls_seen:
                reason = "tool_calls"
        self._choice_finish[choice] = reason
        if not self.unfinished_choices():
            self.finish = self._choice_finish[0]
            self.finished_at = now
            self.state = "done"
        self._events.put_nowait(
            Done(
                reason=reason,
                usage=self.usage(),
                timings=self.timings(now),
                detail=detail,
                stop_string=stop_string,
                choice=choice,
            )
        )

    # ---- read by dialects ---------------------------------------------------------------

    async def wait_for_row(self) -> None:
        """Return once the request holds a row (or has ended); raise its error if it failed while
        still waiting (`Busy` after --queue-timeout). A streaming dialect awaits this before sending
        headers, so a refusal is a real status code, not a 200 with the error inside. If the caller
        is cancelled meanwhile (the client left), the request is cancelled too."""
        try:
            while self.state == "queued" and self.finish is None:
                self._moved.clear()
                await self._moved.wait()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if self._queued_error is not None:
            raise self._queued_error

    async def events(self) -> AsyncIterator[Event]:
        """Every event up to and including the last choice's `Done`, or the `ErrorEvent`.

        Text that queued up while the client's task was behind (hundreds of streams on one event loop)
        goes out as one delta per choice and kind: a chunk per token would cost the loop the same
        again for every token it is already late with, and the delay would only grow."""
        ended = 0
        held: Event | None = None
        while True:
            event, held = (held, None) if held is not None else (await self._events.get(), None)
            while isinstance(event, Delta) and not self._events.empty():
                following = self._events.get_nowait()
                if not _joins(event, following):
                    held = following
                    break
                event = Delta(
                    event.text + following.text, event.kind, event.choice, event.logprobs + following.logprobs
                )
            yield event
            if isinstance(event, Done):
                ended += 1
            if isinstance(event, ErrorEvent) or ended >= self.choices:
                return

    async def collect(self) -> Collected:
        """The whole reply at once: (text, thinking, tool calls, done). Raises the error on failure.
        The answer text's logprobs (when asked for) are in `self.logprobs` afterwards."""
        return (await self.collect_choices())[0]

    async def collect_choices(self) -> list[Collected]:
        """Every choice's whole reply, by index; the last one to end holds the request's usage in its
        `Done`. Raises the error on failure. Each choice's answer logprobs (when asked for) are in
        `self.choice_logprobs[choice]` afterwards."""
        text: list[list[str]] = [[] for _ in range(self.choices)]
        thinking: list[list[str]] = [[] for _ in range(self.choices)]
        calls: list[list] = [[] for _ in range(self.choices)]
        done: list[Done | None] = [None] * self.choices
        async for event in self.events():
            if isinstance(event, Delta):
                (thinking if event.kind == "thinking" else text)[event.choice].append(event.text)
                if event.kind == "text":
                    self.choice_logprobs[event.choice].extend(event.logprobs)
            elif isinstance(event, ErrorEvent):
                raise event.error
            elif isinstance(event, Done):
                done[event.choice] = event
            else:
                calls[event.choice].append(event.call)
        if any(d is None for d in done):  # pragma: no cover
            raise RuntimeError("event stream ended without Done")
        return [
            ("".join(text[c]), "".join(thinking[c]), calls[c], d) for c, d in enumerate(done) if d is not None
        ]

    def cancel(self) -> None:
        """The client went away: free the row (a no-op once finished)."""
        if self.finish is None:
            self._on_cancel(self.job_id)

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """The first (or only) choice's answer logprobs, once collected."""
        return self.choice_logprobs[0]

    @property
    def done(self) -> bool:
        return self.finish is not None

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens, completion_tokens=self.generated, cached_tokens=self.reused
        )

    def timings(self, now: float | None = None) -> Timings:
        now = now or time.monotonic()
        started = self._prefill_started or now
        first = self._first_token_at or now
        return Timings(
            queued=max(0.0, started - self.created - self.load_seconds),
            load=self.load_seconds,
            prompt=max(0.0, first - started),
            decode=max(0.0, now - first),
            total=now - self.created,
        )

    def snapshot(self, now: float) -> RequestSnapshot:
        decode_time = (self.finished_at or now) - (self._first_token_at or now)
        rate = (self.generated - 1) / decode_time if decode_time > 0 and self.generated > 1 else 0.0
        return RequestSnapshot(
            request_id=self.request.request_id or self.job_id,
            dialect=self.request.dialect,
            model=self.model,
            state=self.state,
            prompt_tokens=self.prompt_tokens,
            prompt_processed=self.prompt_processed,
            generated=self.generated,
            reused=self.reused,
            tokens_per_second=rate,
            age=now - self.created,
            tail=self._tail,
            finish=self.finish,
            choices=self.choices,
        )


def _joins(event: Delta, following: Event) -> bool:
    return isinstance(following, Delta) and (following.choice, following.kind) == (event.choice, event.kind)
