"""Embeddings on both engines against each library's own reference, and batched against solo.

The tiny BERT (tests/fixtures/tiny_embed.py) exists twice with the same weights: as a GGUF for
llama.cpp and as a sentence-transformers directory for MLX. References: llama-cpp-python's own
`Llama(embedding=True).embed()` on the same GGUF, and mlx-embeddings' own pooled output (or a numpy
pooling over its token states) on the same directory. The bundled SmolLM2 is a chat model: it embeds
with its last token's state, which is what llama-cpp-python's per-token embeddings end with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kinfer.engines.llama.embed import LlamaEmbeddingEngine, gguf_pooling
from kinfer.engines.llama.engine import LlamaEngine
from kinfer.engines.memory_account import PARTS
from kinfer.engines.mlx.embed import MlxEmbeddingEngine
from kinfer.scheduler.embed_queue import EmbedQueue
from tests.fixtures.tiny_embed import build_tiny_bert_dir, write_tiny_bert_gguf

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "paris is the capital of france",
    "hello world",
    "search query: embedding vector of a document",
    "kinfer is a local server",
    "berlin, germany; tokyo, japan!",
    "the baker bakes bread in the city",
    "a",
]
THIRTY_TWO = [f"{TEXTS[i % len(TEXTS)]} {' '.join(['row'] * (i % 5))} {i}" for i in range(32)]
SAME = 0.9999  # cosine similarity that counts as the same vector


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny-embed")
    return write_tiny_bert_gguf(root / "tiny-embed.gguf"), build_tiny_bert_dir(root / "tiny-embed")


@pytest.fixture(scope="module")
def bert_llama(tiny) -> LlamaEmbeddingEngine:
    engine = LlamaEmbeddingEngine(tiny[0], name="tiny-embed", pooling=gguf_pooling(tiny[0]), threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def bert_mlx(tiny) -> MlxEmbeddingEngine:
    engine = MlxEmbeddingEngine(tiny[1], name="tiny-embed")
    yield engine
    engine.close()


def embed_texts(engine, texts: list[str]) -> list[np.ndarray]:
    return engine.embed([tuple(engine.embed_tokenize(t)) for t in texts])


# ---- llama.cpp ----------------------------------------------------------------------------------


def test_the_gguf_declares_mean_pooling_and_the_engine_reads_it(bert_llama: LlamaEmbeddingEngine) -> None:
    spec = bert_llama.info.embedding
    assert spec is not None and not bert_llama.info.chat
    assert (spec.pooling, spec.dimensions, spec.max_tokens) == ("mean", 32, 128)
    assert spec.appends_eos  # [SEP]


def test_llama_cpp_bert_equals_llama_cpp_python_embed(tiny, bert_llama: LlamaEmbeddingEngine) -> None:
    from llama_cpp import Llama

    reference = Llama(str(tiny[0]), embedding=True, verbose=False, n_ctx=128, n_threads=1)
    try:
        expected = reference.embed(TEXTS)
    finally:
        reference.close()
    got = embed_texts(bert_llama, TEXTS)
    assert [round(cosine(g, e), 4) for g, e in zip(got, expected, strict=True)] == [1.0] * len(TEXTS)
    assert min(cosine(g, e) for g, e in zip(got, expected, strict=True)) >= SAME


def test_llama_cpp_a_batch_of_32_equals_the_32_solo_runs(bert_llama: LlamaEmbeddingEngine) -> None:
    passes = bert_llama.stats().steps_total
    batched = embed_texts(bert_llama, THIRTY_TWO)
    # ~360 tokens (16-aligned: ~580) in llama_decodes of up to 64 cells on a CPU: ten passes for 32 inputs
    assert bert_llama.stats().steps_total == passes + 10
    solo = [embed_texts(bert_llama, [t])[0] for t in THIRTY_TWO]
    assert min(cosine(b, s) for b, s in zip(batched, solo, strict=True)) >= SAME


@pytest.mark.slow
def test_a_chat_model_embeds_with_its_last_token_as_llama_cpp_python_gives_it(smollm2_gguf: Path) -> None:
    from llama_cpp import Llama

    texts = TEXTS[:4]
    engine = LlamaEngine(smollm2_gguf, name="smol", rows=2, ctx=512, threads=1)
    try:
        assert engine.info.chat and engine.info.embedding.pooling == "last"
        got = embed_texts(engine, texts)
        batched = embed_texts(engine, THIRTY_TWO)
        solo = [embed_texts(engine, [t])[0] for t in THIRTY_TWO]
    finally:
        engine.close()
    reference = Llama(str(smollm2_gguf), embedding=True, verbose=False, n_ctx=512, n_threads=1)
    try:
        # no pooling: one vector per token; one call per text (the library's offsets into its output
        # are only right for the first input of a call)
        expected = [reference.embed(t)[-1] for t in texts]
    finally:
        reference.close()
    assert min(cosine(g, e) for g, e in zip(got, expected, strict=True)) >= SAME
    assert min(cosine(b, s) for b, s in zip(batched, solo, strict=True)) >= SAME


# ---- MLX ------------------------------------------------------------------------------------------


def test_mlx_reads_the_directory_sentence_transformers_pooling(bert_mlx: MlxEmbeddingEngine) -> None:
    spec = bert_mlx.info.embedding
    assert spec is not None and not bert_mlx.info.chat
    assert (spec.pooling, spec.dimensions, spec.max_tokens, spec.appends_eos) == ("mean", 32, 128, True)


def test_mlx_equals_mlx_embeddings_own_pooled_output(tiny, bert_mlx: MlxEmbeddingEngine) -> None:
    import mlx.core as mx
    import mlx_embeddings

    # the library end to end: its loader, its tokenizer (transformers), its mean pooling + normalize
    model, tokenizer = mlx_embeddings.load(str(tiny[1]))
    encoded = tokenizer(TEXTS, padding=True, return_tensors="np")
    out = model(mx.array(encoded["input_ids"]), attention_mask=mx.array(encoded["attention_mask"]))
    expected = np.array(out.text_embeds)
    got = embed_texts(bert_mlx, TEXTS)
    assert min(cosine(g, e) for g, e in zip(got, expected, strict=True)) >= SAME


def test_mlx_cls_pooling_equals_a_numpy_pooling_of_the_library_states(tmp_path: Path) -> None:
    import mlx.core as mx
    from mlx_embeddings.utils import load_model

    folder = build_tiny_bert_dir(tmp_path / "tiny-cls", pooling="cls")
    engine = MlxEmbeddingEngine(folder, name="tiny-cls")
    try:
        assert engine.info.embedding.pooling == "cls"
        ids = [engine.embed_tokenize(t) for t in TEXTS]
        got = engine.embed([tuple(i) for i in ids])
    finally:
        engine.close()
    model = load_model(folder)
    expected = [
        np.array(model(mx.array([i]), attention_mask=mx.ones((1, len(i)))).last_hidden_state)[0, 0]
        for i in ids
    ]
    assert min(cosine(g, e) for g, e in zip(got, expected, strict=True)) >= SAME


def test_mlx_a_batch_of_32_equals_the_32_solo_runs(bert_mlx: MlxEmbeddingEngine) -> None:
    batched = embed_texts(bert_mlx, THIRTY_TWO)
    solo = [embed_texts(bert_mlx, [t])[0] for t in THIRTY_TWO]
    assert min(cosine(b, s) for b, s in zip(batched, solo, strict=True)) >= SAME


def test_both_engines_give_the_same_vectors_for_the_same_token_ids(bert_llama, bert_mlx) -> None:
    # same weights, same token ids: the two engines agree (GELU and float order differ slightly)
    ids = [tuple(bert_mlx.embed_tokenize(t)) for t in TEXTS]
    assert ids == [tuple(bert_llama.embed_tokenize(t)) for t in TEXTS]
    on_llama, on_mlx = bert_llama.embed(ids), bert_mlx.embed(ids)
    assert min(cosine(a, b) for a, b in zip(on_llama, on_mlx, strict=True)) >= 0.999


def test_a_generative_mlx_model_embeds_with_its_last_token(tmp_path: Path) -> None:
    import mlx.core as mx

    from kinfer.engines.mlx.engine import MlxEngine
    from tests.fixtures.tiny_mlx import build_tiny_model

    folder = build_tiny_model(tmp_path / "tiny-qwen3", "qwen3")
    engine = MlxEngine(folder, name="tiny-qwen3", rows=2, ctx=256, self_check=False)
    try:
        assert engine.info.chat and engine.info.embedding.pooling == "last"
        ids = [tuple(engine.embed_tokenize(t)) for t in THIRTY_TWO]
        batched = engine.embed(ids)
        # mlx-lm's own backbone, one unpadded input at a time
        solo = [np.array(engine._model.model(mx.array([list(i)])))[0, -1] for i in ids]
    finally:
        engine.close()
    assert min(cosine(b, s) for b, s in zip(batched, solo, strict=True)) >= SAME


# ---- the engine thread's queue --------------------------------------------------------------------


def embed_work(engine, request, job_id: str, reply, progress=lambda *p: None):
    """The work the scheduler sends: inputs tokenized in the request's task, as `Scheduler.embed` does."""
    from kinfer.scheduler.embed_prepare import tokenize_inputs
    from kinfer.scheduler.jobs import EmbedWork

    return EmbedWork(request, job_id, tokenize_inputs(engine, request), reply, progress)


def test_waiting_requests_share_one_pass(bert_llama: LlamaEmbeddingEngine) -> None:
    from concurrent.futures import Future

    from kinfer.embedding import EmbedRequest

    queue = EmbedQueue(lambda callback, *args: callback(*args))
    replies = []
    for n, text in enumerate(TEXTS[:2]):  # two requests of two short inputs: 64 cells, one CPU pass
        reply: Future = Future()
        replies.append(reply)
        request = EmbedRequest(model="tiny-embed", inputs=(text, TEXTS[n + 3]))
        queue.add(embed_work(bert_llama, request, f"job-{n}", reply))
    passes = bert_llama.stats().steps_total
    queue.run_pass(bert_llama)
    assert bert_llama.stats().steps_total == passes + 1 and not queue
    vectors = [r.result(timeout=1)[0] for r in replies]
    solo = embed_texts(bert_llama, [TEXTS[0], TEXTS[3]])
    assert min(cosine(a, b) for a, b in zip(vectors[0], solo, strict=True)) >= SAME


def test_a_request_larger_than_the_pass_budget_is_embedded_over_several_turns(
    bert_llama: LlamaEmbeddingEngine,
) -> None:
    from concurrent.futures import Future

    from kinfer.embedding import EmbedRequest

    progress: list[tuple[int, int]] = []
    queue = EmbedQueue(lambda callback, *args: callback(*args))
    reply: Future = Future()
    # 2048 tokens per pass; 40 inputs of 128 tokens (truncated) take three turns of the engine loop
    request = EmbedRequest(model="tiny-embed", inputs=tuple(" ".join(["row"] * 300) for _ in range(40)))
    queue.add(embed_work(bert_llama, request, "big", reply, lambda *p: progress.append(p)))
    turns = 0
    while queue:
        queue.run_pass(bert_llama)
        turns += 1
    assert turns == 3 and progress == [(16, 2048), (32, 4096)]
    vectors, tokens = reply.result(timeout=1)
    assert len(vectors) == 40 and tokens == [128] * 40


def test_a_request_cancelled_during_its_pass_is_dropped_quietly(bert_llama: LlamaEmbeddingEngine) -> None:
    from concurrent.futures import Future

    from kinfer.embedding import EmbedRequest

    queue = EmbedQueue(lambda callback, *args: callback(*args))
    gone: Future = Future()
    kept: Future = Future()
    for job_id, reply in (("gone", gone), ("kept", kept)):
        queue.add(embed_work(bert_llama, EmbedRequest(model="tiny-embed", inputs=("hello",)), job_id, reply))
    gone.cancel()  # the client left; its Cancel has not reached the engine thread yet
    queue.run_pass(bert_llama)
    assert not queue and len(kept.result(timeout=1)[0]) == 1


def test_both_embedding_engines_report_the_memory_accounts_parts(bert_llama, bert_mlx) -> None:
    for engine in (bert_llama, bert_mlx):
        memory = engine.stats().memory
        assert set(PARTS) | {"total"} <= set(memory), type(engine).__name__
        assert 0 < memory["weights"] <= memory["total"]
