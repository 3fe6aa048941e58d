"""Ollama's /api where the exact reply matters: the scripted engine writes it, the rest is real.

Timings that include the model load, `think: "max"`, Ollama's 400 for thinking or tools a model
cannot serve, `/api/delete` of an alias, and `/api/generate`'s `context` going out and coming back.
"""

from __future__ import annotations

import time

import httpx
import ollama
import pytest

from tests.live_server import running_server, server_settings
from tests.scripted_engine import ScriptedEngine
from tests.server.dialect_helpers import template

QWEN3 = template("qwen3-0.6b.jinja")
SMOLLM2 = template("smollm2-135m-instruct.jinja")
LLAMA32 = template("llama-3.2-3b-instruct.jinja")
HI = [{"role": "user", "content": "Hi."}]
TOOLS = [{"type": "function", "function": {"name": "noop", "description": "Nothing.", "parameters": {}}}]
LOAD_S = 0.5


def test_total_duration_includes_the_load(kinfer_home) -> None:
    """Ollama's total_duration runs from the request's arrival, load included; it is never below
    load_duration (it used to start after the load)."""

    def slow_load(model, settings, ctx):
        time.sleep(LOAD_S)
        return ScriptedEngine(lambda prompt: "Hello.")

    with running_server(server_settings(kinfer_home), engine_factory=slow_load) as server:
        reply = ollama.Client(host=server.url).chat(model="smollm2", messages=HI, stream=False)

    assert reply.load_duration >= LOAD_S * 1e9
    parts = reply.load_duration + reply.prompt_eval_duration + reply.eval_duration
    assert reply.total_duration >= parts


def test_think_max_asks_for_the_highest_effort(scripted) -> None:
    with scripted(lambda prompt: "<think>\nHm.\n</think>\n\nHi!", QWEN3) as s:
        reply = ollama.Client(host=s.url).chat(model="smollm2", messages=HI, think="max", stream=False)
    assert (reply.message.thinking, reply.message.content) == ("Hm.", "Hi!")
    assert s.prompts[0].endswith("<|im_start|>assistant\n<think>\n")


def test_thinking_on_a_model_without_it_is_a_400(scripted) -> None:
    with scripted(lambda prompt: "Hi!", SMOLLM2) as s:
        client = ollama.Client(host=s.url)
        with pytest.raises(ollama.ResponseError) as refused:
            client.chat(model="smollm2", messages=HI, think=True, stream=False)
        assert refused.value.status_code == 400
        assert refused.value.error == '"smollm2" does not support thinking'
        with pytest.raises(ollama.ResponseError):
            client.generate(model="smollm2", prompt="Hi.", think="low", stream=False)
        # turning thinking off is always fine
        assert client.chat(model="smollm2", messages=HI, think=False, stream=False).message.content == "Hi!"
    assert len(s.prompts) == 1  # the refused requests never reached the engine


def test_tools_are_refused_only_by_a_model_that_really_cannot_use_them(scripted) -> None:
    # SmolLM2's template has no tool support: kinfer's default tool prompt serves it
    with scripted(lambda prompt: "Hi!", SMOLLM2) as s:
        reply = ollama.Client(host=s.url).chat(model="smollm2", messages=HI, tools=TOOLS, stream=False)
        assert reply.message.content == "Hi!"
    # Llama 3.2's template prints tools in a convention kinfer cannot parse back
    with scripted(lambda prompt: "Hi!", LLAMA32) as s, pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=s.url).chat(model="smollm2", messages=HI, tools=TOOLS, stream=False)
    assert refused.value.status_code == 400
    assert refused.value.error == "smollm2 does not support tools"


def test_deleting_an_alias_leaves_the_model_loaded(scripted) -> None:
    with scripted(lambda prompt: "Hi!") as s:
        client = ollama.Client(host=s.url)
        client.chat(model="smollm2:135m", messages=HI, stream=False)
        client.copy("smollm2:135m", "my-smol")

        client.delete("my-smol")

        assert [m.model for m in client.ps().models] == ["smollm2:135m"]
        assert [m.model for m in client.list().models] == ["smollm2:135m"]


def test_generate_returns_the_context_and_takes_it_back(scripted) -> None:
    """`context` is the prompt and the reply as token ids (the scripted engine's tokens are
    characters); sent back, it is read ahead of the next prompt."""
    with scripted(lambda prompt: "Paris.") as s:
        first = httpx.post(
            s.url + "/api/generate",
            json={"model": "smollm2", "prompt": "Capital of France?", "stream": False},
        ).json()
        assert "".join(map(chr, first["context"])) == s.prompts[0] + "Paris."

        streamed = httpx.post(
            s.url + "/api/generate",
            json={"model": "smollm2", "prompt": "And of Italy?", "context": first["context"]},
        )
        *_, last = [line for line in streamed.text.splitlines() if line]
        second_prompt = s.prompts[1]
        assert second_prompt.startswith(s.prompts[0] + "Paris.")
        assert second_prompt.endswith("And of Italy?<|im_end|>\n<|im_start|>assistant\n")
        assert "".join(map(chr, ollama.GenerateResponse.model_validate_json(last).context)) == (
            second_prompt + "Paris."
        )

        raw = httpx.post(
            s.url + "/api/generate", json={"model": "smollm2", "prompt": "x", "raw": True, "stream": False}
        ).json()
        assert "context" not in raw  # as in Ollama, a raw prompt gets none


def test_a_context_of_impossible_token_ids_is_a_400(scripted) -> None:
    with scripted(lambda prompt: "Hi!") as s:
        reply = httpx.post(
            s.url + "/api/generate",
            json={"model": "smollm2", "prompt": "Hi.", "context": [-1, 2], "stream": False},
        )
    assert reply.status_code == 400 and "context" in reply.json()["error"]
