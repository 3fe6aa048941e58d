"""Embeddings end to end: the real server, driven by the openai and ollama SDKs, LangChain and LiteLLM.

The store holds the tiny BERT twice (a GGUF on llama.cpp, a sentence-transformers directory on MLX,
same weights; tests/fixtures/tiny_embed.py), a copy whose name marks it Matryoshka, and the bundled
SmolLM2 (a chat model, which Ollama's dialect embeds too).
"""

from __future__ import annotations

import base64
import re
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest

from tests.fixtures.tiny_embed import POSITIONS, build_tiny_bert_dir, write_tiny_bert_gguf
from tests.live_server import LiveServer, running_server, server_settings

GGUF, MLX, MATRYOSHKA, CHAT = "tiny-embed", "tiny-embed-mlx", "tiny-matryoshka-embed", "smollm2:135m"
TEXTS = ["the quick brown fox", "paris is the capital of france", "hello world"]
LONG = " ".join(["row"] * (POSITIONS * 2))  # twice the tiny model's context


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("kinfer-home")
    models = home / "models"
    gguf = write_tiny_bert_gguf(models / f"{GGUF}.gguf")
    shutil.copyfile(gguf, models / f"{MATRYOSHKA}.gguf")
    build_tiny_bert_dir(models / MLX)
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    try:
        with running_server(server_settings(home, max_loaded=4, parallel=2, ctx=1024)) as live:
            yield live
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def oll(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url)


@pytest.fixture(scope="module")
def reference(server: LiveServer) -> dict[str, np.ndarray]:
    """llama-cpp-python's own embeddings of TEXTS on the same GGUF, unit length."""
    from llama_cpp import Llama

    path = server.runtime.store.resolve(GGUF).path
    llm = Llama(str(path), embedding=True, verbose=False, n_ctx=POSITIONS, n_threads=1)
    try:
        vectors = np.array(llm.embed(TEXTS))
    finally:
        llm.close()
    return {t: v / np.linalg.norm(v) for t, v in zip(TEXTS, vectors, strict=True)}


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- OpenAI --------------------------------------------------------------------------------------


def test_openai_sdk_float_vectors_are_llama_cpp_python_s_normalized(oai: openai.OpenAI, reference) -> None:
    reply = oai.embeddings.create(model=GGUF, input=TEXTS, encoding_format="float")
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == GGUF
    for text, item in zip(TEXTS, reply.data, strict=True):
        assert len(item.embedding) == 32
        assert abs(np.linalg.norm(item.embedding) - 1) < 1e-5
        assert cosine(item.embedding, reference[text]) >= 0.9999
    # [CLS] the quick brown fox [SEP] + [CLS] paris is the capital of france [SEP] + [CLS] hello world [SEP]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == 6 + 8 + 4


def test_openai_sdk_base64_decodes_to_the_float_vectors(oai: openai.OpenAI, server: LiveServer) -> None:
    floats = oai.embeddings.create(model=GGUF, input=TEXTS, encoding_format="float")
    # the SDK asks for base64 by default and decodes it itself
    decoded = oai.embeddings.create(model=GGUF, input=TEXTS)
    for a, b in zip(floats.data, decoded.data, strict=True):
        assert np.allclose(a.embedding, b.embedding, atol=1e-7)
    raw = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": GGUF, "input": "hello world", "encoding_format": "base64"},
    ).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vector, floats.data[2].embedding, atol=1e-7)


def test_the_mlx_directory_gives_the_gguf_s_vectors(oai: openai.OpenAI) -> None:
    on_llama = oai.embeddings.create(model=GGUF, input=TEXTS)
    on_mlx = oai.embeddings.create(model=MLX, input=TEXTS)
    assert on_mlx.usage.prompt_tokens == on_llama.usage.prompt_tokens
    for a, b in zip(on_llama.data, on_mlx.data, strict=True):
        assert cosine(a.embedding, b.embedding) >= 0.999


def test_token_ids_are_embedded_as_given(oai: openai.OpenAI, oll: ollama.Client) -> None:
    text = oai.embeddings.create(model=GGUF, input="hello world").data[0].embedding
    ids = [2, 53, 54, 3]  # [CLS] hello world [SEP] in the tiny vocabulary
    one = oai.embeddings.create(model=GGUF, input=ids)
    many = oai.embeddings.create(model=GGUF, input=[ids, ids[:2]])
    assert one.usage.prompt_tokens == 4 and many.usage.prompt_tokens == 6
    assert cosine(one.data[0].embedding, text) >= 0.99999
    assert cosine(many.data[0].embedding, text) >= 0.99999


def test_dimensions_truncate_a_matryoshka_model_and_are_refused_for_others(oai: openai.OpenAI) -> None:
    full = np.array(oai.embeddings.create(model=MATRYOSHKA, input="hello world").data[0].embedding)
    cut = np.array(
        oai.embeddings.create(model=MATRYOSHKA, input="hello world", dimensions=8).data[0].embedding
    )
    assert cut.shape == (8,) and abs(np.linalg.norm(cut) - 1) < 1e-5
    assert np.allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    with pytest.raises(openai.BadRequestError, match="Matryoshka"):
        oai.embeddings.create(model=GGUF, input="hello world", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="at most 32"):
        oai.embeddings.create(model=MATRYOSHKA, input="hello world", dimensions=64)


def test_openai_refuses_a_chat_model_and_an_input_beyond_the_context(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="chat model, not an embedding model"):
        oai.embeddings.create(model=CHAT, input="hello")
    with pytest.raises(openai.BadRequestError, match="more than the model's context of 128"):
        oai.embeddings.create(model=GGUF, input=LONG)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "must not be an empty list"),
        ({"input": ""}, "must not be an empty string"),
        ({"input": ["hello"] * 100_000}, "at most 2048"),
        ({"input": ["hello", 3.5]}, r"input\[1\] must be a non-empty string"),
        ({"input": ["hello", ""]}, r"input\[1\] must be a non-empty string"),
        ({"input": ["hello", None]}, r"input\[1\]"),
        ({"input": [[1, 2], "x"]}, r"input\[1\]"),
        ({"input": [[1, True]]}, r"input\[0\]"),
        ({"input": [1, 99999]}, "outside the vocabulary"),
        ({"input": {"text": "x"}}, "input must be a string"),
        ({}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
    ],
)
def test_bad_input_is_a_400_in_openai_s_shape(server: LiveServer, body: dict, message: str) -> None:
    reply = httpx.post(server.url + "/v1/embeddings", json={"model": GGUF, **body}, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert re.search(message, error["message"])


def test_an_unknown_model_is_a_404(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-model", input="hello")


# ---- Ollama --------------------------------------------------------------------------------------


def test_ollama_embed_normalizes_and_reports_timings(oll: ollama.Client, reference) -> None:
    reply = oll.embed(model=GGUF, input=TEXTS)
    assert len(reply.embeddings) == 3 and reply.model == GGUF
    for text, vector in zip(TEXTS, reply.embeddings, strict=True):
        assert abs(np.linalg.norm(vector) - 1) < 1e-5
        assert cosine(vector, reference[text]) >= 0.9999
    assert reply.prompt_eval_count == 18
    assert reply.total_duration >= reply.load_duration >= 0 and reply.total_duration > 0


def test_ollama_embeddings_legacy_returns_the_raw_vector(oll: ollama.Client, reference) -> None:
    raw = np.array(oll.embeddings(model=GGUF, prompt="hello world").embedding)
    assert abs(np.linalg.norm(raw) - 1) > 0.1  # not normalized, as Ollama's legacy route
    assert cosine(raw, reference["hello world"]) >= 0.9999


def test_ollama_embeds_with_a_chat_model(oll: ollama.Client) -> None:
    reply = oll.embed(model=CHAT, input=["hello", "the capital of France"])
    assert [len(v) for v in reply.embeddings] == [576, 576]
    assert cosine(reply.embeddings[0], reply.embeddings[1]) < 0.9999
    assert "completion" in oll.show(CHAT).capabilities


def test_ollama_truncates_by_default_and_refuses_when_told_not_to(oll: ollama.Client) -> None:
    reply = oll.embed(model=GGUF, input=LONG)
    assert reply.prompt_eval_count == POSITIONS
    with pytest.raises(ollama.ResponseError) as refused:
        oll.embed(model=GGUF, input=LONG, truncate=False)
    assert refused.value.status_code == 400 and "context of 128" in refused.value.error


def test_ollama_dimensions_truncate_any_model(oll: ollama.Client) -> None:
    full = np.array(oll.embed(model=GGUF, input="hello world").embeddings[0])
    cut = np.array(oll.embed(model=GGUF, input="hello world", dimensions=8).embeddings[0])
    assert np.allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)


def test_no_input_only_loads_the_model(server: LiveServer) -> None:
    reply = httpx.post(server.url + "/api/embed", json={"model": MLX}, timeout=60).json()
    assert reply == {"model": MLX, "embeddings": []}
    assert MLX in [m.name for m in server.runtime.scheduler.loaded_models()]
    legacy = httpx.post(server.url + "/api/embeddings", json={"model": MLX, "prompt": ""}, timeout=60)
    assert legacy.json() == {"embedding": []}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "must not be an empty list"),
        ({"input": ["hello"] * 100_000}, "at most 2048"),
        ({"input": ["hello", 3]}, "invalid input type"),
        ({"input": [[1, 2]]}, "invalid input type"),
        ({"input": "x", "dimensions": -1}, "dimensions must be a positive integer"),
        ({"input": "x", "truncate": "maybe"}, "truncate"),
    ],
)
def test_bad_input_is_a_400_in_ollama_s_shape(server: LiveServer, body: dict, message: str) -> None:
    reply = httpx.post(server.url + "/api/embed", json={"model": GGUF, **body}, timeout=60)
    assert reply.status_code == 400
    assert list(reply.json()) == ["error"] and message in reply.json()["error"]


def test_an_embedding_model_does_not_chat(oll: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        oll.chat(model=GGUF, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 400 and "embedding model" in refused.value.error


def test_show_reports_the_embedding_capability(oll: ollama.Client) -> None:
    assert oll.show(GGUF).capabilities == ["embedding"]
    assert oll.show(MLX).capabilities == ["embedding"]


# ---- clients built on the SDKs ---------------------------------------------------------------------


def test_langchain_openai_embeddings(server: LiveServer, reference) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain would otherwise send tiktoken ids (OpenAI's vocabulary)
    embedder = OpenAIEmbeddings(
        model=GGUF, base_url=server.url + "/v1", api_key="unused", check_embedding_ctx_length=False
    )
    documents = embedder.embed_documents(TEXTS)
    query = embedder.embed_query("hello world")
    assert [cosine(d, reference[t]) >= 0.9999 for t, d in zip(TEXTS, documents, strict=True)] == [True] * 3
    assert cosine(query, documents[2]) >= 0.99999


def test_langchain_ollama_embeddings(server: LiveServer, reference) -> None:
    from langchain_ollama import OllamaEmbeddings

    embedder = OllamaEmbeddings(model=GGUF, base_url=server.url)
    documents = embedder.embed_documents(TEXTS)
    assert [cosine(d, reference[t]) >= 0.9999 for t, d in zip(TEXTS, documents, strict=True)] == [True] * 3
    assert cosine(embedder.embed_query("hello world"), documents[2]) >= 0.99999


@pytest.mark.parametrize("provider", ["openai", "ollama"])
def test_litellm_embedding(
    server: LiveServer, reference, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LiteLLM fetches its model price list from GitHub on import unless told to use its own copy
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    base = server.url + ("/v1" if provider == "openai" else "")
    reply = litellm.embedding(model=f"{provider}/{GGUF}", input=TEXTS, api_base=base, api_key="unused")
    vectors = [item["embedding"] for item in reply.data]
    assert [cosine(v, reference[t]) >= 0.9999 for t, v in zip(TEXTS, vectors, strict=True)] == [True] * 3
    assert reply.usage.prompt_tokens == 18


# ---- scheduling, metrics, dashboard ----------------------------------------------------------------


def test_concurrent_requests_all_get_their_own_vectors(oai: openai.OpenAI, reference) -> None:
    results: dict[int, list] = {}

    def ask(n: int) -> None:
        text = TEXTS[n % 3]
        results[n] = oai.embeddings.create(model=GGUF, input=[text] * 8, encoding_format="float").data

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(16))
    for n, data in results.items():
        assert all(cosine(d.embedding, reference[TEXTS[n % 3]]) >= 0.9999 for d in data)


@pytest.mark.slow
def test_an_embedding_never_waits_for_a_long_chat_reply(server: LiveServer, oll: ollama.Client) -> None:
    done = threading.Event()

    def long_reply() -> None:
        oll.generate(
            model=CHAT, prompt="Count to ten thousand.", options={"num_predict": 400, "temperature": 0}
        )
        done.set()

    oll.embed(model=CHAT, input="warm up")  # loaded before the race starts
    writer = threading.Thread(target=long_reply)
    writer.start()
    try:
        deadline = time.monotonic() + 60
        while not any(r.state == "decoding" for r in server.runtime.scheduler.snapshot().requests):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        reply = oll.embed(model=CHAT, input=["hello", "world"])  # the same model's engine thread
        assert len(reply.embeddings) == 2
        assert not done.is_set()  # the chat reply is still being written
    finally:
        writer.join(300)


def test_a_client_that_leaves_cancels_the_rest_of_its_inputs(server: LiveServer, oll: ollama.Client) -> None:
    # 2,048 inputs of 128 tokens (truncated): hundreds of 2,048-token turns of the engine loop
    many = [f"{n} {LONG}" for n in range(2048)]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/api/embed", json={"model": GGUF, "input": many}, timeout=1.0)
    started = time.monotonic()
    assert len(oll.embed(model=GGUF, input=["still here"]).embeddings) == 1
    waited = time.monotonic() - started
    left = next(r for r in server.runtime.scheduler.snapshot().requests if r.tail.endswith("/2048 inputs"))
    assert left.finish == "cancelled"
    done = int(left.tail.split()[1].split("/")[0])
    assert done < 2048
    # the next request waited for at most the pass under way, not for the abandoned inputs
    assert waited < 5, (waited, done)


def test_metrics_count_embedded_inputs_and_tokens(server: LiveServer, oai: openai.OpenAI) -> None:
    def counters() -> dict[str, float]:
        text = httpx.get(server.url + "/metrics").text
        return {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith(("kinfer_embedded_inputs_total", "kinfer_embedded_tokens_total"))
        }

    before = counters()
    oai.embeddings.create(model=GGUF, input=TEXTS)
    after = counters()
    assert after["kinfer_embedded_inputs_total"] - before["kinfer_embedded_inputs_total"] == 3
    assert after["kinfer_embedded_tokens_total"] - before["kinfer_embedded_tokens_total"] == 18


def test_the_dashboard_shows_embedding_requests(server: LiveServer, oai: openai.OpenAI) -> None:
    from kinfer.tui.live import LiveSource

    source = LiveSource(server.runtime.scheduler, server.runtime.requests)
    server.call(_open(source))
    try:
        oai.embeddings.create(model=GGUF, input=TEXTS)
        entries, sample = [], None
        for _ in range(100):  # the access log's record follows the response's last byte
            sample = server.call(_sample(source))
            entries += [e for e in sample.finished if e.request_id.startswith("embd-")]
            if entries:
                break
            time.sleep(0.05)
    finally:
        server.call(_close(source))
    # the request log's line: the HTTP request with the embedding it ran
    entry = entries[0]
    assert (entry.path, entry.status, entry.dialect, entry.model) == ("/v1/embeddings", 200, "openai", GGUF)
    assert (entry.prompt_tokens, entry.generated, entry.finish) == (18, 0, "stop")
    row = next(r for r in sample.scheduler.requests if r.request_id == entry.request_id)
    assert row.tail == "embed 3/3 inputs -> 32 dims" and row.state == "done"


async def _open(source) -> None:
    source.open()


async def _close(source) -> None:
    source.close()


async def _sample(source):
    return source()


def test_the_store_lists_the_directory_for_mlx(server: LiveServer) -> None:
    model = server.runtime.store.resolve(MLX)
    assert model.format == "mlx" and Path(model.path).is_dir()
