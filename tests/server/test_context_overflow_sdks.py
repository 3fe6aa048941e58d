"""A prompt past the bundled SmolLM2's row, as the official SDKs and the frameworks on top of them see it.

Each keys on the official shape: the openai SDK on `code == "context_length_exceeded"`, the anthropic
SDK's users on a message starting "prompt is too long", LangChain and LiteLLM on both to raise their
context-window errors. Ollama truncates by default, so its SDK gets an answer.
"""

from __future__ import annotations

import os

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.live_server import LiveServer

pytestmark = pytest.mark.slow

# never fetch LiteLLM's price list from the network (it does on import otherwise)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TOO_LONG = [{"role": "user", "content": "Count the words. " + "word " * 6000}]  # > 4096 tokens


def test_the_openai_sdk_raises_bad_request_with_context_length_exceeded(smol_server: LiveServer):
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="smollm2", messages=TOO_LONG, max_tokens=4)
    assert refused.value.code == "context_length_exceeded"


def test_the_anthropic_sdk_raises_bad_request_saying_prompt_is_too_long(smol_server: LiveServer):
    client = anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="smollm2", max_tokens=4, messages=TOO_LONG)
    message = refused.value.body["error"]["message"]
    assert message.startswith("prompt is too long: ") and "tokens > 4095 maximum" in message
    assert refused.value.request_id and refused.value.request_id.startswith("req_")


def test_the_ollama_sdk_gets_an_answer_to_the_newest_turns(smol_server: LiveServer):
    history = []
    for n in range(60):  # ~7,000 tokens of old conversation before the question
        history += [
            {"role": "user", "content": f"Note {n}: " + "the sky was grey, the sea was calm that day " * 5},
            {"role": "assistant", "content": f"Noted ({n})."},
        ]
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        *history,
        {"role": "user", "content": "What is the capital of France?"},
    ]
    options = {"temperature": 0, "num_predict": 8}
    # the whole conversation does not fit (the SDK has no `truncate` argument yet: plain HTTP)
    body = {"model": "smollm2", "messages": messages, "options": options, "stream": False, "truncate": False}
    whole = httpx.post(smol_server.url + "/api/chat", json=body, timeout=120)
    assert whole.status_code == 400 and "exceeds the context length" in whole.json()["error"]
    reply = ollama.Client(host=smol_server.url).chat(model="smollm2", messages=messages, options=options)
    assert reply.done and reply.message.content
    assert 0 < reply.prompt_eval_count < 4096


def test_langchain_openai_raises_its_context_overflow_error(smol_server: LiveServer):
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="smollm2", base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(ContextOverflowError):
        chat.invoke(TOO_LONG[0]["content"])


def test_langchain_anthropic_raises_its_context_overflow_error(smol_server: LiveServer):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.exceptions import ContextOverflowError

    chat = ChatAnthropic(
        model="smollm2", base_url=smol_server.url, api_key="unused", max_retries=0, max_tokens=4
    )
    with pytest.raises(ContextOverflowError):
        chat.invoke(TOO_LONG[0]["content"])


@pytest.mark.parametrize(
    ("model", "base"), [("openai/smollm2", "/v1"), ("anthropic/smollm2", "")], ids=["openai", "anthropic"]
)
def test_litellm_raises_context_window_exceeded(smol_server: LiveServer, model: str, base: str):
    import litellm

    litellm.telemetry = False
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(
            model=model,
            api_base=smol_server.url + base,
            api_key="unused",
            messages=TOO_LONG,
            max_tokens=4,
            num_retries=0,
        )
