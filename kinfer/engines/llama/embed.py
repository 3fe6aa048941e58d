"""Embeddings on llama.cpp: an embedding context beside (or instead of) the chat context.

`LlamaEmbedder` owns one llama.cpp context made with `embeddings = true` and the model's pooling. It
packs many inputs into each `llama_decode` (one sequence id per input, every token an output), as
llama-server and llama-cpp-python's `Llama.embed` do, and reads one pooled vector per sequence.
The KV cache is unified (one buffer shared by the pass's sequences) and cleared before each pass:
an embedding keeps nothing between passes.

- An embedding model (its GGUF has `<arch>.pooling_type`, as Ollama decides) is served by
  `LlamaEmbeddingEngine`: no chat context, chat requests are refused.
- A generative model asked to embed (Ollama allows it) gets an embedder with last-token pooling,
  made on first use by `LlamaEngine.embed`; llama.cpp would give such a model no pooling, and
  Ollama then takes the last token's state.

Non-causal encoders (BERT) need a whole pass in one micro-batch, so their n_ubatch is the context's size.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp as lib  # isort: skip

from kinfer.engines.base import EmbeddingSpec, EngineStats, GenerationJob, JobUpdate, ModelInfo, Pooling
from kinfer.engines.embedding import EMBED_BATCH_TOKENS, GGUF_POOLING, MAX_EMBED_TOKENS, is_matryoshka
from kinfer.engines.llama import native
from kinfer.engines.llama.memory import BufferSizes, llama_account, parse_buffer_sizes
from kinfer.engines.llama.sizing import available_threads
from kinfer.errors import EngineFailure, InvalidRequest

log = logging.getLogger(__name__)

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


def gguf_pooling(path: Path) -> Pooling | None:
    """The pooling an embedding GGUF declares (`<arch>.pooling_type`), None for a generative model."""
    from kinfer.store.gguf_header import read_gguf_header

    value = read_gguf_header(path).arch_value("pooling_type")
    return GGUF_POOLING.get(value) if isinstance(value, int) else None


def tokenize_special(vocab: native.Vocab, text: str) -> list[int]:
    """Tokens with the special tokens the vocabulary adds (BOS / [CLS], EOS / [SEP]), as llama-server
    tokenizes embedding inputs."""
    data = text.encode("utf-8")
    capacity = len(data) + 8
    while True:
        tokens = (lib.llama_token * capacity)()
        n = lib.llama_tokenize(vocab._vocab, data, len(data), tokens, capacity, True, True)
        if n >= 0:
            return list(tokens[:n])
        capacity = -n


def appends_closing_token(vocab: native.Vocab) -> bool:
    """Whether the tokenizer ends every input with a special token (BERT's [SEP], an EOS)."""
    probe = tokenize_special(vocab, "a")
    plain = vocab.tokenize("a")
    return len(probe) > len(plain) and (not plain or probe[-1] != plain[-1])


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
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_AUTO if gpu else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
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
        self.passes = 0

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


def embedding_spec(
    embedder_max: int, dimensions: int, pooling: Pooling, vocab: native.Vocab, names: tuple[str | None, ...]
) -> EmbeddingSpec:
    return EmbeddingSpec(
        dimensions=dimensions,
        pooling=pooling,
        max_tokens=embedder_max,
        batch_tokens=max(embedder_max, EMBED_BATCH_TOKENS),
        vocab_size=vocab.n_tokens,
        appends_eos=appends_closing_token(vocab),
        matryoshka=is_matryoshka(*names),
    )


class LlamaEmbeddingEngine:
    """An embedding GGUF (BERT, nomic-bert, Qwen3-Embedding, EmbeddingGemma...) on llama.cpp: the
    `Engine` protocol with no rows (it never generates) plus `embed`."""

    def __init__(
        self, path: Path, *, name: str, pooling: Pooling, ctx: int = 0, threads: int = 0, gpu_layers: int = -1
    ) -> None:
        native.init_backend()
        gpu = native.supports_gpu_offload() and gpu_layers != 0
        self._model = native.load_model(Path(path), gpu_layers if gpu else 0)
        self._embedder: LlamaEmbedder | None = None
        try:
            facts = native.model_facts(self._model)
            self._vocab = native.Vocab(self._model)
            causal = native.meta_string(self._model, f"{facts.architecture}.attention.causal") != "false"
            train = facts.train_context or MAX_EMBED_TOKENS
            max_tokens = min(train, ctx) if ctx > 0 else min(train, MAX_EMBED_TOKENS)
            self._embedder = LlamaEmbedder(
                self._model,
                pooling=pooling,
                causal=causal,
                max_tokens=max_tokens,
                threads=threads if threads > 0 else available_threads(),
                gpu=gpu,
            )
        except BaseException:
            self.close()
            raise
        general = native.meta_string(self._model, "general.name")
        spec = embedding_spec(max_tokens, self._embedder.dimensions, pooling, self._vocab, (name, general))
        self._facts = facts
        self._tokens = 0
        self.info = ModelInfo(
            name=name,
            engine="llama.cpp",
            architecture=facts.architecture,
            chat_template=None,
            bos_token=self._vocab.bos_text,
            eos_token=self._vocab.eos_text,
            context_length=max_tokens,
            rows=0,
            train_context_length=facts.train_context,
            embedding=spec,
            chat=False,
        )
        log.info(
            "llama.cpp: %s (%s) embeds: %d dims, %s pooling, %d tokens per input",
            name,
            facts.architecture,
            spec.dimensions,
            pooling,
            max_tokens,
        )

    # ---- embeddings -------------------------------------------------------------------------

    def embed_tokenize(self, text: str) -> list[int]:
        return tokenize_special(self._vocab, text)

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        assert self._embedder is not None
        self._tokens += sum(len(i) for i in inputs)
        return self._embedder.embed(inputs)

    # ---- the Engine protocol: an embedding model has no rows --------------------------------

    def tokenize(self, text: str) -> list[int]:
        return self._vocab.tokenize(text)

    def detokenize(self, tokens: list[int]) -> str:
        return self._vocab.detokenize(list(tokens))

    @property
    def free_rows(self) -> int:
        return 0

    @property
    def has_work(self) -> bool:
        return False

    def submit(self, job: GenerationJob) -> int:
        raise InvalidRequest(f"{self.info.name} is an embedding model; it does not generate text")

    def cancel(self, job_id: str) -> None:
        pass

    def step(self) -> list[JobUpdate]:
        return []

    def stats(self) -> EngineStats:
        embedder = self._embedder
        return EngineStats(
            prompt_tokens_total=self._tokens,
            steps_total=embedder.passes if embedder else 0,
            memory=(
                llama_account(
                    native.buffer_sizes(self._model) + (embedder.buffers if embedder else BufferSizes()),
                    weights=self._facts.model_bytes,
                    kv=0,
                    pool_slots=0,
                    sequences=0,
                ).as_dict()
                if hasattr(self, "_facts")
                else {}
            ),
        )

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._model:
            native.free_model(self._model)
            self._model = 0
