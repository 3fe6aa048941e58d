"""One llama.cpp embedding context: many inputs packed into each `llama_decode`, one pooled vector each.

`LlamaEmbedder` owns a context made with `embeddings = true` and the model's pooling. It packs many
inputs into each `llama_decode` (one sequence id per input, every token an output), as llama-server
and llama-cpp-python's `Llama.embed` do, and reads one pooled vector per sequence. The KV cache is
unified (one buffer shared by the pass's sequences) and cleared before each pass: an embedding keeps
nothing between passes. Non-causal encoders (BERT) need a whole pass in one micro-batch, so their
n_ubatch is the context's size.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp as lib  # isort: skip

from kinfer.engines.base import Pooling
from kinfer.engines.llama import native
from kinfer.engines.llama.memory import parse_buffer_sizes
from kinfer.errors import EngineFailure, InvalidRequest

EMBED_SEQUENCES = 128  # sequence ids per pass, fillers included (llama.cpp caps them at 256)
ALIGN = 16  # cells an input's start is aligned to (8 sufficed with AVX2; measured in _fill's terms)
# Cells per llama_decode, unless one input is longer. Every token of a pass attends, masked, over the
# whole pass; on a CPU that cost, growing with the pass's square, outweighs what wider matrix products
# save: a MiniLM-shaped BERT on one thread embedded 62-token inputs at 13.5 inputs per CPU-second in
# 512-cell passes, 25 in 64-cell ones (13-token inputs: 48 vs 87). A causal SmolLM2 was no slower.
GPU_PASS_TOKENS = 512  # llama-server's micro-batch
CPU_PASS_TOKENS = 64
POOLING_CODE = {
    "mean": lib.LLAMA_POOLING_TYPE_MEAN,
    "cls": lib.LLAMA_POOLING_TYPE_CLS,
    "last": lib.LLAMA_POOLING_TYPE_LAST,
}


class LlamaEmbedder:
    """An embedding context over a loaded llama.cpp model (`model` is borrowed, not freed here)."""

    def __init__(
        self, model: int, *, pooling: Pooling, causal: bool, max_tokens: int, threads: int, gpu: bool
    ) -> None:
        self.max_tokens = max_tokens
        self.pass_tokens = GPU_PASS_TOKENS if gpu else CPU_PASS_TOKENS
        self.capacity = max(max_tokens, self.pass_tokens)
        self.sequences = min(EMBED_SEQUENCES, native.max_sequences())
        params = lib.llama_context_default_params()
        params.n_ctx = self.capacity
        params.n_batch = self.capacity
        self._ubatch = GPU_PASS_TOKENS if causal else self.capacity
        params.n_ubatch = self._ubatch
        params.n_seq_max = self.sequences
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = True  # one pass's sequences share the cells; the cache is cleared each pass
        params.embeddings = True
        params.pooling_type = POOLING_CODE[pooling]
        params.flash_attn_type = native.flash_attn_type(None, gpu)  # auto: llama.cpp's on a GPU, off on a CPU
        params.no_perf = True
        with native.capture_log() as lines:
            self._ctx = lib.llama_init_from_model(model, params)
        if not self._ctx:
            raise EngineFailure(f"llama.cpp could not create an embedding context of {self.capacity} tokens")
        self.buffers = parse_buffer_sizes(lines)  # for the memory account
        self._mem = lib.llama_get_memory(self._ctx)
        self.dimensions = native.model_embedding_length(model)
        self._batch = native.TokenBatch(self.capacity)
        self._filler_token = max(0, int(lib.llama_vocab_bos(lib.llama_model_get_vocab(model))))
        self.threads = threads  # EmbedderPool changes it with llama_set_n_threads
        self.passes = 0

    @property
    def ctx(self) -> int:
        return self._ctx

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """One pooled vector per input; as many inputs per `llama_decode` as fit."""
        vectors: list[np.ndarray] = []
        i = 0
        while i < len(inputs):
            count = self._fill(inputs, i)
            if self._mem:
                lib.llama_memory_clear(self._mem, True)
            rc = native.decode(self._ctx, self._batch)
            if rc != 0:
                raise EngineFailure(
                    f"llama_decode failed ({rc}) on an embedding pass of {self._batch.n} tokens"
                )
            for seq in range(count):
                ptr = lib.llama_get_embeddings_seq(self._ctx, seq)
                if not ptr:
                    raise EngineFailure("llama.cpp returned no pooled embedding")
                array = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
                vectors.append(np.ctypeslib.as_array(array, shape=(self.dimensions,)).copy())
            self.passes += 1
            i += count
        return vectors

    def _fill(self, inputs: list[tuple[int, ...]], first: int) -> int:
        """Put inputs[first:] into the batch while they fit; returns how many went in.

        Each input starts at a multiple of ALIGN cells and never straddles a micro-batch boundary
        it could stay within; each gap is filled by a filler sequence of its own that nobody attends to. A
        batched input then meets the same kernels, in the same lanes, as when it runs alone, and its
        vector is the solo one bit for bit (unaligned, 1 input in 3 differed, cosine down to 0.9998
        on SmolLM2)."""
        batch = self._batch
        batch.clear()
        count = gaps = 0
        # sequence ids: inputs count up from 0, each gap's filler takes one from the top down
        while first + count < len(inputs) and count + gaps + 2 <= self.sequences:
            tokens = inputs[first + count]
            if len(tokens) > self.max_tokens:
                raise InvalidRequest(f"an input of {len(tokens)} tokens exceeds {self.max_tokens}")
            start = self._place(batch.n, len(tokens))
            if count and start + len(tokens) > self.pass_tokens:
                break
            if batch.n < start:
                filler = self.sequences - 1 - gaps
                for pos in range(start - batch.n):
                    batch.add(self._filler_token, pos, filler, True)
                gaps += 1
            for pos, token in enumerate(tokens):
                batch.add(token, pos, count, True)
            count += 1
        return count

    def _place(self, at: int, length: int) -> int:
        start = -(-at // ALIGN) * ALIGN
        room = self._ubatch - start % self._ubatch
        return start + room if length > room else start

    def close(self) -> None:
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = 0
