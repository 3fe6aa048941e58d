"""The thread count of a llama.cpp context's passes: the tuner's choice for decode steps, every
thread for prompt chunks.

A decode step carries one token per row, so each of its ops is small and its many barriers are what
a busy machine makes slow (thread_tuner.py). A prompt chunk carries hundreds of tokens per op: the
barriers are few against the work, and beside busy processes one thread prefilled no faster than
two (measured: a 500-token prompt, 5.0-6.4 s either way on a 2-core VM with two busy processes),
while a quiet machine prefills about twice as fast on two. So prompt chunks keep every thread.

`llama_set_n_threads` only sets two numbers in the context (ggml's OpenMP team takes the count of the
next pass), so switching before every pass costs nothing measurable.
"""

from __future__ import annotations

import logging
import time

from kinfer.engines.llama import native
from kinfer.engines.llama.thread_tuner import ThreadTuner, TunerConfig

log = logging.getLogger(__name__)


class DecodeThreads:
    """Sets the context's thread count before each pass and feeds the tuner the decode steps' times.

    `threads`: every thread the engine may use (prompt chunks, and decode steps without a tuner).
    `tuning`: the tuner's config, or None for a fixed count (`--threads N`, a GPU, one core)."""

    def __init__(self, ctx: int, threads: int, tuning: TunerConfig | None) -> None:
        self._ctx = ctx
        self.all = threads
        self.tuner = ThreadTuner(tuning) if tuning is not None else None
        self._set = threads  # the count the context has now (create_context gave it every thread)
        self._started = (threads, 0.0, 0.0)  # the decode step under way: count, wall and CPU clocks

    @property
    def decoding(self) -> int:
        """The count decode steps settled on (what /metrics shows; a probe is not a change)."""
        return self.tuner.current if self.tuner is not None else self.all

    def start_decode(self) -> None:
        """Set the count of the decode step about to run, and start its clocks."""
        threads = self._use(self.tuner.threads if self.tuner is not None else self.all)
        self._started = (threads, time.perf_counter(), time.thread_time())

    def for_prompt(self) -> None:
        self._use(self.all)

    def decoded(self, tokens: int) -> None:
        """The decode step started by `start_decode` ran `tokens` rows. Its wall time, and the CPU
        time of this thread (ggml's first worker: it tells whether the OS shared its core out)."""
        if self.tuner is None:
            return
        threads, wall, cpu = self._started
        seconds, cpu_seconds = time.perf_counter() - wall, time.thread_time() - cpu
        switch = self.tuner.record(threads, tokens, seconds, cpu_seconds)
        if switch is not None:
            log.info(
                "llama.cpp: decoding on %d thread(s) instead of %d (steps took %.2fx the time)",
                switch.after,
                switch.before,
                switch.ratio,
            )

    def _use(self, threads: int) -> int:
        if threads != self._set:
            native.set_threads(self._ctx, threads)
            self._set = threads
        return threads
