"""Parallel embedding contexts on a CPU (`EmbedderPool`): many inputs spread over the contexts come
back in order and equal what one context gives each input alone; a lone input keeps every thread.

The tiny BERT of tests/fixtures/tiny_embed.py; three contexts even where fewer cores exist (the
result must not depend on how many run at once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kinfer.engines.llama.embed import LlamaEmbeddingEngine, gguf_pooling
from kinfer.errors import InvalidRequest
from tests.fixtures.tiny_embed import POSITIONS, write_tiny_bert_gguf

SAME = 0.9999  # cosine similarity that counts as the same vector
TEXTS = [f"the quick brown fox {' '.join(['row'] * (i % 9))} jumps over {i} lazy dog" for i in range(48)]


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert_gguf(tmp_path_factory.mktemp("tiny-embed") / "tiny-embed.gguf")


@pytest.fixture(scope="module")
def pooled(gguf: Path) -> LlamaEmbeddingEngine:
    engine = LlamaEmbeddingEngine(gguf, name="tiny-embed", pooling=gguf_pooling(gguf), threads=3)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def single(gguf: Path) -> LlamaEmbeddingEngine:
    engine = LlamaEmbeddingEngine(gguf, name="tiny-embed", pooling=gguf_pooling(gguf), threads=1)
    yield engine
    engine.close()


def tokens(engine: LlamaEmbeddingEngine, texts: list[str]) -> list[tuple[int, ...]]:
    return [tuple(engine.embed_tokenize(t)) for t in texts]


def test_the_contexts_default_to_one_per_thread(pooled, single) -> None:
    assert pooled._embedder.contexts == 3 and single._embedder.contexts == 1


def test_many_inputs_come_back_in_order_from_every_context_equal_to_solo_runs(pooled, single) -> None:
    before = pooled._embedder.passes_by_context()
    batched = pooled.embed(tokens(pooled, TEXTS))
    used = [after - was for after, was in zip(pooled._embedder.passes_by_context(), before, strict=True)]
    assert all(n > 0 for n in used), used  # the passes were spread over all three contexts
    solo = [single.embed(tokens(single, [text]))[0] for text in TEXTS]
    assert min(cosine(b, s) for b, s in zip(batched, solo, strict=True)) >= SAME
    # in order: each vector is its own input's, not a neighbour's
    assert all(cosine(batched[i], solo[i + 1]) < SAME for i in range(len(TEXTS) - 1))


def test_a_lone_input_runs_on_one_context_with_every_thread(pooled) -> None:
    pool = pooled._embedder
    pooled.embed(tokens(pooled, TEXTS[:4]))  # several pieces: the threads were shared out
    before = pool.passes_by_context()
    pooled.embed(tokens(pooled, [TEXTS[0]]))
    after = pool.passes_by_context()
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0, 0]
    assert pool._embedders[0].threads == 3


def test_an_input_too_long_fails_the_call_and_the_pool_keeps_serving(pooled) -> None:
    inputs = tokens(pooled, TEXTS[:8])
    with pytest.raises(InvalidRequest):
        pooled.embed([*inputs, tuple([5] * (POSITIONS + 1))])
    assert len(pooled.embed(inputs)) == 8


def test_a_turn_of_the_engine_loop_takes_a_pass_budget_per_context(pooled, single) -> None:
    assert pooled.info.embedding.batch_tokens == 3 * single.info.embedding.batch_tokens


def test_more_contexts_than_threads_run_one_thread_each(gguf: Path, single) -> None:
    engine = LlamaEmbeddingEngine(gguf, name="tiny-embed", pooling=gguf_pooling(gguf), threads=2, contexts=4)
    try:
        vectors = engine.embed(tokens(engine, TEXTS[:12]))
        assert [e.threads for e in engine._embedder._embedders] == [1, 1, 1, 1]
        solo = [single.embed(tokens(single, [text]))[0] for text in TEXTS[:12]]
        assert min(cosine(v, s) for v, s in zip(vectors, solo, strict=True)) >= SAME
    finally:
        engine.close()
