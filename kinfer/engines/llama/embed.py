"""Embeddings on llama.cpp: embedding contexts (`embed_context.LlamaEmbedder`) beside (or instead of)
the chat context.

- An embedding model (its GGUF has `<arch>.pooling_type`, as Ollama decides) is served by
  `LlamaEmbeddingEngine`: no chat context, chat requests are refused.
- A generative model asked to embed (Ollama allows it) gets an embedder with last-token pooling,
  made on first use by `LlamaEngine.embed`; llama.cpp would give such a model no pooling, and
  Ollama then takes the last token's state.
- On a CPU an embedding model gets several contexts decoding in parallel (`embed_pool.EmbedderPool`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp as lib  # isort: skip

from kinfer.engines.base import EmbeddingSpec, EngineStats, GenerationJob, JobUpdate, ModelInfo, Pooling
from kinfer.engines.embedding import EMBED_BATCH_TOKENS, GGUF_POOLING, MAX_EMBED_TOKENS, is_matryoshka
from kinfer.engines.llama import native
from kinfer.engines.llama.embed_context import LlamaEmbedder
from kinfer.engines.llama.embed_pool import EmbedderPool
from kinfer.engines.llama.memory import BufferSizes, llama_account
from kinfer.engines.llama.sizing import available_threads
from kinfer.errors import InvalidRequest

log = logging.getLogger(__name__)


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
    `Engine` protocol with no rows (it never generates) plus `embed`. On a CPU, `contexts` embedding
    contexts (0: one per thread) decode passes in parallel (`EmbedderPool`); on a GPU, one."""

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        pooling: Pooling,
        ctx: int = 0,
        threads: int = 0,
        gpu_layers: int = -1,
        contexts: int = 0,
    ) -> None:
        native.init_backend()
        gpu = native.supports_gpu_offload() and gpu_layers != 0
        self._model = native.load_model(Path(path), gpu_layers if gpu else 0)
        self._embedder: LlamaEmbedder | EmbedderPool | None = None
        try:
            facts = native.model_facts(self._model)
            self._vocab = native.Vocab(self._model)
            causal = native.meta_string(self._model, f"{facts.architecture}.attention.causal") != "false"
            train = facts.train_context or MAX_EMBED_TOKENS
            max_tokens = min(train, ctx) if ctx > 0 else min(train, MAX_EMBED_TOKENS)
            threads = threads if threads > 0 else available_threads()
            if gpu:  # one pass on a GPU is wide enough: one context
                self._embedder = LlamaEmbedder(
                    self._model,
                    pooling=pooling,
                    causal=causal,
                    max_tokens=max_tokens,
                    threads=threads,
                    gpu=gpu,
                )
            else:
                self._embedder = EmbedderPool(
                    self._model,
                    contexts=contexts if contexts > 0 else threads,
                    pooling=pooling,
                    causal=causal,
                    max_tokens=max_tokens,
                    threads=threads,
                )
        except BaseException:
            self.close()
            raise
        general = native.meta_string(self._model, "general.name")
        spec = embedding_spec(max_tokens, self._embedder.dimensions, pooling, self._vocab, (name, general))
        if isinstance(self._embedder, EmbedderPool):
            # a turn's passes run side by side: as many tokens per context as one context takes, so a
            # turn lasts as long and its last pass leaves the other contexts idle for a smaller share
            spec = replace(spec, batch_tokens=spec.batch_tokens * self._embedder.contexts)
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
