"""Several embedding contexts decoding independent passes in parallel, on a CPU.

A small non-causal pass (64 cells on a CPU) scales badly across the threads of one `llama_decode`:
ggml waits at a barrier after every op, and an op on 64 rows is short. The same cores decoding
independent passes, one thread each, never wait for one another. `EmbedderPool` holds one context
per thread and splits a call's inputs into pieces of about one pass each; its workers take the
pieces in order, each decoding on a context of its own (`llama_decode` releases the GIL).

When a call has fewer pieces than contexts (one short request), the contexts that run share the
threads among them (`llama_set_n_threads`), so a lone input still gets every core. An input's vector
does not depend on the pass it shares or on the thread count, so the result is the solo one whichever
context embeds it.
"""

from __future__ import annotations

import logging
import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kinfer.engines.base import Pooling
from kinfer.engines.llama import native
from kinfer.engines.llama.embed_context import ALIGN, LlamaEmbedder
from kinfer.engines.llama.memory import BufferSizes

log = logging.getLogger(__name__)


class EmbedderPool:
    """`contexts` embedding contexts over one loaded model, sharing `threads` cores; the same `embed`
    as `LlamaEmbedder` (`model` is borrowed, not freed here)."""

    def __init__(
        self, model: int, *, contexts: int, pooling: Pooling, causal: bool, max_tokens: int, threads: int
    ) -> None:
        self.threads = max(1, threads)
        self._embedders: list[LlamaEmbedder] = []
        self._executor: ThreadPoolExecutor | None = None
        try:
            for _ in range(max(1, contexts)):
                self._embedders.append(
                    LlamaEmbedder(
                        model, pooling=pooling, causal=causal, max_tokens=max_tokens, threads=1, gpu=False
                    )
                )
        except BaseException:
            self.close()
            raise
        first = self._embedders[0]
        self.max_tokens = first.max_tokens
        self.dimensions = first.dimensions
        self.pass_tokens = first.pass_tokens
        self._set_threads(first, self.threads)  # one context alone has every thread
        if len(self._embedders) > 1:
            self._executor = ThreadPoolExecutor(len(self._embedders), thread_name_prefix="embed")
        self._free: queue.SimpleQueue[LlamaEmbedder] = queue.SimpleQueue()
        log.info("llama.cpp: %d embedding contexts share %d threads", len(self._embedders), self.threads)

    @property
    def contexts(self) -> int:
        return len(self._embedders)

    @property
    def passes(self) -> int:
        return sum(e.passes for e in self._embedders)

    @property
    def buffers(self) -> BufferSizes:
        total = BufferSizes()
        for embedder in self._embedders:
            total = total + embedder.buffers
        return total

    def passes_by_context(self) -> list[int]:
        return [e.passes for e in self._embedders]

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """One pooled vector per input, in order; pieces of about one pass spread over the contexts."""
        pieces = self._pieces(inputs)
        running = min(len(pieces), len(self._embedders))
        if running <= 1 or self._executor is None:
            first = self._embedders[0]
            self._set_threads(first, self.threads)
            return first.embed(inputs)
        # the threads shared among the contexts that run; the first ones get any left over (more
        # contexts than threads, as --embed-contexts may ask: one thread each)
        for n, embedder in enumerate(self._embedders):
            self._set_threads(embedder, max(1, self.threads // running + (n < self.threads % running)))
        free = self._free
        for embedder in self._embedders[:running]:
            free.put(embedder)

        def run(piece: list[tuple[int, ...]]) -> list[np.ndarray]:
            embedder = free.get()
            try:
                return embedder.embed(piece)
            finally:
                free.put(embedder)

        futures = [self._executor.submit(run, piece) for piece in pieces]
        try:
            return [vector for future in futures for vector in future.result()]
        finally:
            for future in futures:  # every context is idle again before this returns, even on an error
                future.cancel()
            for future in futures:
                if not future.cancelled():
                    future.exception()
            while not free.empty():
                free.get_nowait()

    def _pieces(self, inputs: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
        """Consecutive inputs, about one pass's cells each (an input longer than a pass is one piece)."""
        pieces: list[list[tuple[int, ...]]] = []
        piece: list[tuple[int, ...]] = []
        cells = 0
        for tokens in inputs:
            start = -(-cells // ALIGN) * ALIGN  # as LlamaEmbedder places it
            if piece and start + len(tokens) > self.pass_tokens:
                pieces.append(piece)
                piece, start = [], 0
            piece.append(tokens)
            cells = start + len(tokens)
        if piece:
            pieces.append(piece)
        return pieces

    @staticmethod
    def _set_threads(embedder: LlamaEmbedder, threads: int) -> None:
        if embedder.threads != threads:
            native.set_threads(embedder.ctx, threads)
            embedder.threads = threads

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for embedder in self._embedders:
            embedder.close()
        self._embedders = []
