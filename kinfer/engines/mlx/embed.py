"""Embeddings on MLX: encoder directories through mlx-embeddings, generative ones through mlx-lm.

- An embedding directory (sentence-transformers files, or an encoder such as BERT) is served by
  `MlxEmbeddingEngine`. The model classes and the weight loading are mlx-embeddings' (its
  `utils.load_model`: BERT, XLM-RoBERTa, ModernBERT, Qwen3, Gemma3 ...); the tokenizer is the
  directory's tokenizer.json (with its post-processor: [CLS] ... [SEP]); the pooling and the
  normalisation are the directory's own (modules.json, 1_Pooling/config.json), applied here to the
  library's token states. Where the pipeline holds modules kinfer does not apply (EmbeddingGemma's
  Dense layers), the library's own pooled output is used instead.
- A generative model's `MlxEngine.embed` runs mlx-lm's backbone (no cache) and takes the last token's
  state, as Ollama does with llama.cpp.

Inputs of one pass are right-padded into one [batch, length] array; grouped by length so padding stays
small. Right padding leaves a causal model's states untouched, and encoders mask the padding.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from kinfer.engines.base import EmbeddingSpec, EngineStats, GenerationJob, JobUpdate, ModelInfo, Pooling
from kinfer.engines.embedding import (
    EMBED_BATCH_TOKENS,
    MAX_EMBED_TOKENS,
    SentenceTransformers,
    embedding_pooling,
    is_matryoshka,
    read_sentence_transformers,
)
from kinfer.engines.memory_account import MemoryAccount
from kinfer.engines.mlx.memory import weight_bytes
from kinfer.errors import EngineFailure, InvalidRequest

log = logging.getLogger(__name__)

POSITION_OFFSET = {"xlm-roberta": 2, "xlm_roberta": 2, "roberta": 2}  # RoBERTa's positions start at 2


def is_embedding_directory(path: Path) -> bool:
    """A sentence-transformers directory, or an encoder-only architecture (never a chat model)."""
    config = _read_json(path / "config.json")
    return embedding_pooling(path, config) is not None


def pool(states: mx.array, lengths: mx.array, pooling: Pooling) -> mx.array:
    """[batch, length, dims] right-padded states -> [batch, dims], over each row's first `lengths`."""
    positions = mx.arange(states.shape[1])[None, :]
    mask = (positions < lengths[:, None]).astype(states.dtype)[:, :, None]
    if pooling == "mean":
        return (states * mask).sum(axis=1) / lengths[:, None].astype(states.dtype)
    if pooling == "cls":
        return states[:, 0]
    if pooling == "last":
        return mx.take_along_axis(states, (lengths - 1)[:, None, None], axis=1)[:, 0]
    return mx.where(mask > 0, states, mx.array(-np.inf, dtype=states.dtype)).max(axis=1)


def length_groups(inputs: list[tuple[int, ...]], budget: int) -> list[list[int]]:
    """Indices of `inputs` grouped by length (longest first), each group's padded size within budget."""
    order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups and len(inputs[groups[-1][0]]) * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def padded(inputs: list[tuple[int, ...]], pad: int) -> tuple[mx.array, mx.array]:
    width = max(len(i) for i in inputs)
    ids = mx.array([list(i) + [pad] * (width - len(i)) for i in inputs], dtype=mx.int32)
    return ids, mx.array([len(i) for i in inputs], dtype=mx.int32)


class MlxEmbeddingEngine:
    """An embedding directory on MLX: the `Engine` protocol with no rows (it never generates) + `embed`."""

    def __init__(self, path: Path, *, name: str, ctx: int = 0) -> None:
        from tokenizers import Tokenizer

        try:
            from mlx_embeddings.utils import load_model
        except ImportError as exc:
            raise EngineFailure(
                f"{name} is an embedding model; MLX embeddings need the mlx-embeddings package "
                f"(pip install 'kinfer[embeddings]'): {exc}"
            ) from exc
        path = Path(path)
        try:
            self._model = load_model(path)
        except (ValueError, FileNotFoundError, KeyError) as exc:
            raise EngineFailure(f"{path}: mlx-embeddings cannot load this model: {exc}") from exc
        config: dict[str, Any] = json.loads((path / "config.json").read_text(encoding="utf-8"))
        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tok.no_padding()
        self._tok.no_truncation()
        pipeline = read_sentence_transformers(path) or SentenceTransformers("mean", False, ())
        # modules kinfer does not apply itself: the library's pooled, normalized output stands in
        self._library_pooling = bool(pipeline.other_modules)
        self.pooling: Pooling = pipeline.pooling
        model_type = str(config.get("model_type", "unknown"))
        positions = int(config.get("max_position_embeddings") or MAX_EMBED_TOKENS)
        positions -= POSITION_OFFSET.get(model_type, 0)
        max_tokens = min(positions, ctx) if ctx > 0 else min(positions, MAX_EMBED_TOKENS)
        tokenizer_config = _read_json(path / "tokenizer_config.json")
        pad = tokenizer_config.get("pad_token")
        pad_id = self._tok.token_to_id(pad if isinstance(pad, str) else "") if pad else None
        self._pad = pad_id if pad_id is not None else 0
        probe, plain = self._tok.encode("a").ids, self._tok.encode("a", add_special_tokens=False).ids
        dims = int(self._probe_dimensions())
        self._tokens = 0
        self._passes = 0
        spec = EmbeddingSpec(
            dimensions=dims,
            pooling=self.pooling,
            max_tokens=max_tokens,
            batch_tokens=max(max_tokens, EMBED_BATCH_TOKENS),
            vocab_size=self._tok.get_vocab_size(with_added_tokens=True),
            appends_eos=len(probe) > len(plain) and (not plain or probe[-1] != plain[-1]),
            matryoshka=is_matryoshka(name, path.name, str(config.get("_name_or_path", ""))),
        )
        self.info = ModelInfo(
            name=name,
            engine="mlx",
            architecture=model_type,
            chat_template=None,
            bos_token="",
            eos_token="",
            context_length=max_tokens,
            rows=0,
            train_context_length=positions,
            embedding=spec,
            chat=False,
        )
        log.info(
            "MLX: %s (%s) embeds: %d dims, %s pooling%s, %d tokens per input",
            name,
            model_type,
            dims,
            self.pooling,
            " (the library's own)" if self._library_pooling else "",
            max_tokens,
        )

    def _probe_dimensions(self) -> int:
        ids, lengths = padded([tuple(self._tok.encode("a").ids)], self._pad)
        return int(self._forward(ids, lengths).shape[-1])

    def _forward(self, ids: mx.array, lengths: mx.array) -> mx.array:
        mask = (mx.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(mx.int32)
        out = self._model(ids, attention_mask=mask)
        if self._library_pooling and out.text_embeds is not None:
            return out.text_embeds
        return pool(out.last_hidden_state, lengths, self.pooling)

    # ---- embeddings -------------------------------------------------------------------------

    def embed_tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        spec = self.info.embedding
        assert spec is not None
        vectors: list[np.ndarray | None] = [None] * len(inputs)
        for group in length_groups(inputs, spec.batch_tokens):
            ids, lengths = padded([inputs[i] for i in group], self._pad)
            pooled = self._forward(ids, lengths).astype(mx.float32)
            values = np.array(pooled)
            for row, i in enumerate(group):
                vectors[i] = values[row]
            self._passes += 1
        self._tokens += sum(len(i) for i in inputs)
        return [v for v in vectors if v is not None]

    # ---- the Engine protocol: an embedding model has no rows --------------------------------

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def detokenize(self, tokens: list[int]) -> str:
        return self._tok.decode(list(tokens), skip_special_tokens=False)

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
        return EngineStats(
            prompt_tokens_total=self._tokens,
            steps_total=self._passes,
            memory={
                **MemoryAccount.from_allocator(
                    mx.get_active_memory(),
                    weights=weight_bytes(self._model),
                    kv=0,
                    state=0,
                    pool=0,
                    cache=mx.get_cache_memory(),
                    in_flight=0,  # a batch is evaluated before `embed` returns: nothing runs between
                ).as_dict(),
                "peak": mx.get_peak_memory(),
            },
        )

    def close(self) -> None:
        self._model = None
        mx.clear_cache()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def backbone(model: Any) -> Any:
    """mlx-lm's inner model (token ids -> final normed states) of a causal LM, or None."""
    for candidate in (
        getattr(model, "model", None),
        getattr(getattr(model, "language_model", None), "model", None),
    ):
        if candidate is not None and callable(candidate):
            return candidate
    return None


def generative_spec(
    config: dict[str, Any], ctx: int, vocab: int, names: tuple[str, ...]
) -> EmbeddingSpec | None:
    """How a generative directory embeds: its final states' width, last-token pooling."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    hidden = text.get("hidden_size", config.get("hidden_size"))
    if not isinstance(hidden, int):
        return None
    max_tokens = min(ctx, MAX_EMBED_TOKENS)
    return EmbeddingSpec(
        dimensions=hidden,
        pooling="last",
        max_tokens=max_tokens,
        batch_tokens=max(max_tokens, EMBED_BATCH_TOKENS),
        vocab_size=vocab,
        matryoshka=is_matryoshka(*names),
    )


def embed_generative(model: Any, inputs: list[tuple[int, ...]], budget: int) -> list[np.ndarray]:
    """Last-token states of a causal mlx-lm model, inputs right-padded into length groups. Any failure
    is an `EngineFailure` (the chat rows beside it go on)."""
    inner = backbone(model)
    if inner is None:
        raise EngineFailure("this architecture exposes no backbone to embed with")
    vectors: list[np.ndarray | None] = [None] * len(inputs)
    try:
        for group in length_groups(inputs, budget):
            ids, lengths = padded([inputs[i] for i in group], 0)
            states = inner(ids)
            values = np.array(pool(states, lengths, "last").astype(mx.float32))
            for row, i in enumerate(group):
                vectors[i] = values[row]
    except Exception as exc:
        raise EngineFailure(f"MLX embedding pass failed: {exc}") from exc
    return [v for v in vectors if v is not None]
