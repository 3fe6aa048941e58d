"""logit_bias and logprobs through every dialect that has them, against the real server on the bundled
SmolLM2 (llama.cpp), with the official SDKs: OpenAI Chat and Completions, Responses, Ollama."""

from __future__ import annotations

import asyncio
import math

import httpx
import ollama
import openai
import pytest

from tests.live_server import LiveServer

pytestmark = pytest.mark.slow

ONE_WORD = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def client(smol_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def paris(client: openai.OpenAI, smollm2_gguf) -> tuple[int, str]:
    """The id and text of the token that names Paris in the greedy answer."""
    from llama_cpp import Llama

    reply = client.chat.completions.create(
        model="smollm2", messages=ONE_WORD, temperature=0, max_tokens=10, logprobs=True
    )
    first = next(lp for lp in reply.choices[0].logprobs.content if "Paris" in lp.token)
    vocab = Llama(str(smollm2_gguf), vocab_only=True, verbose=False)
    (token,) = vocab.tokenize(bytes(first.bytes), add_bos=False, special=False)
    return token, first.token


def sampled_replies(server: LiveServer, count: int, **fields) -> list:
    """`count` short sampled chat replies, sent concurrently."""

    async def run() -> list:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0
        ) as aclient:
            calls = [
                aclient.chat.completions.create(
                    model="smollm2", messages=ONE_WORD, temperature=1.0, max_tokens=8, logprobs=True, **fields
                )
                for _ in range(count)
            ]
            return list(await asyncio.gather(*calls))

    return server.call(run(), timeout=600)


def tokens_of(reply) -> list[str]:
    return [lp.token for lp in reply.choices[0].logprobs.content]


# ---- logit_bias ---------------------------------------------------------------------------------


def test_a_banned_token_never_appears_in_100_sampled_replies(smol_server: LiveServer, paris: tuple[int, str]):
    token, text = paris
    free = sampled_replies(smol_server, 20)
    assert any(t == text for r in free for t in tokens_of(r)), "unbiased, the model says it"

    banned = sampled_replies(smol_server, 100, logit_bias={str(token): -100})

    assert len(banned) == 100
    seen = [t for r in banned for t in tokens_of(r)]
    assert seen and all(r.choices[0].logprobs.content for r in banned)
    assert text not in seen


def test_a_forced_token_is_every_generated_token(client: openai.OpenAI, paris: tuple[int, str]):
    token, text = paris
    reply = client.chat.completions.create(
        model="smollm2",
        messages=FRANCE,
        temperature=1.0,
        max_tokens=8,
        logprobs=True,
        logit_bias={str(token): 100},
    )
    content = reply.choices[0].logprobs.content
    assert [lp.token for lp in content] == [text] * 8
    assert reply.choices[0].finish_reason == "length"


# ---- logprobs, dialect by dialect -----------------------------------------------------------------


def test_chat_logprobs_cover_the_text_greedy_picks_the_top_token_and_streams_agree(client: openai.OpenAI):
    whole = client.chat.completions.create(
        model="smollm2", messages=FRANCE, temperature=0, max_tokens=24, logprobs=True, top_logprobs=3
    )
    content = whole.choices[0].logprobs.content
    assert "".join(lp.token for lp in content) == whole.choices[0].message.content
    for lp in content:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3
        assert lp.top_logprobs[0].token == lp.token and lp.top_logprobs[0].logprob == lp.logprob
        assert bytes(lp.bytes).decode() == lp.token

    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=FRANCE,
            temperature=0,
            max_tokens=24,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
    )
    streamed = [
        lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content
    ]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in content]
    for c in chunks:  # each chunk's logprobs hold its own text
        if c.choices and c.choices[0].delta.content:
            assert "".join(lp.token for lp in c.choices[0].logprobs.content) == c.choices[0].delta.content

    plain = client.chat.completions.create(model="smollm2", messages=FRANCE, temperature=0, max_tokens=8)
    assert plain.choices[0].logprobs is None  # not asked: not computed, not sent


def test_completions_logprobs_come_in_the_legacy_columns(client: openai.OpenAI):
    whole = client.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=8, logprobs=2
    )
    lp = whole.choices[0].logprobs
    assert "".join(lp.tokens) == whole.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) <= 2 and max(top, key=top.get) == token and top[token] == value

    chunks = list(
        client.completions.create(
            model="smollm2",
            prompt="The capital of France is",
            temperature=0,
            max_tokens=8,
            logprobs=2,
            stream=True,
        )
    )
    streamed = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens
    ]
    assert streamed == lp.tokens


def test_responses_logprobs_on_the_output_text_and_the_delta_events(client: openai.OpenAI):
    include = ["message.output_text.logprobs"]
    whole = client.responses.create(
        model="smollm2",
        input=FRANCE[0]["content"],
        temperature=0,
        max_output_tokens=24,
        include=include,
        top_logprobs=2,
    )
    part = whole.output[0].content[0]
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].token == lp.token for lp in part.logprobs)

    with client.responses.stream(
        model="smollm2",
        input=FRANCE[0]["content"],
        temperature=0,
        max_output_tokens=24,
        include=include,
        top_logprobs=2,
    ) as stream:
        events = list(stream)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [lp.token for e in deltas for lp in e.logprobs] == [lp.token for lp in part.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.logprob for lp in done.logprobs] == [lp.logprob for lp in part.logprobs]


def test_ollama_chat_and_generate_carry_logprobs_on_each_chunk(smol_server: LiveServer):
    client = ollama.Client(host=smol_server.url)
    options = {"temperature": 0, "num_predict": 16, "repeat_penalty": 1.0}
    whole = client.chat(
        model="smollm2", messages=FRANCE, options=options, stream=False, logprobs=True, top_logprobs=2
    )
    assert "".join(lp.token for lp in whole.logprobs) == whole.message.content
    assert all(lp.top_logprobs[0].token == lp.token for lp in whole.logprobs)

    chunks = list(
        client.chat(
            model="smollm2", messages=FRANCE, options=options, stream=True, logprobs=True, top_logprobs=2
        )
    )
    streamed = [lp.token for c in chunks for lp in (c.logprobs or ())]
    assert streamed == [lp.token for lp in whole.logprobs]

    generated = client.generate(
        model="smollm2", prompt="The capital of France is", options=options, logprobs=True
    )
    assert "".join(lp.token for lp in generated.logprobs) == generated.response
    assert all(math.isfinite(lp.logprob) and lp.top_logprobs == [] for lp in generated.logprobs)
    pieces = list(
        client.generate(
            model="smollm2", prompt="The capital of France is", options=options, logprobs=True, stream=True
        )
    )
    assert [lp.token for p in pieces for lp in (p.logprobs or ())] == [lp.token for lp in generated.logprobs]


# ---- refusals, each in its dialect's shape ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/chat/completions", {"messages": FRANCE, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": FRANCE, "top_logprobs": 3}, "needs logprobs"),
        ("/v1/chat/completions", {"messages": FRANCE, "logit_bias": {"50": 150}}, "between -100 and 100"),
        ("/v1/chat/completions", {"messages": FRANCE, "logit_bias": {"hello": 5}}, "not a token id"),
        (
            "/v1/chat/completions",
            {"messages": FRANCE, "logit_bias": {"99999999": 5}},
            "outside the vocabulary",
        ),
        ("/v1/chat/completions", {"messages": FRANCE, "logit_bias": [1, 2]}, "logit_bias"),
        ("/v1/chat/completions", {"messages": FRANCE, "logit_bias": {"1": "much"}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": FRANCE, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "Hi", "logit_bias": {"1.5": 5}}, "not a token id"),
        ("/v1/responses", {"input": "Hi", "top_logprobs": 2}, "needs logprobs"),
        (
            "/v1/responses",
            {"input": "Hi", "include": ["message.output_text.logprobs"], "top_logprobs": 30},
            "top_logprobs",
        ),
    ],
)
def test_bad_values_get_a_400_in_openai_shape(smol_server: LiveServer, path: str, body: dict, fragment: str):
    reply = httpx.post(smol_server.url + path, json={"model": "smollm2", **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and fragment in error["message"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"top_logprobs": 2}, "needs logprobs")],
)
def test_bad_values_get_a_400_in_ollama_shape(smol_server: LiveServer, body: dict, fragment: str):
    reply = httpx.post(
        smol_server.url + "/api/chat", json={"model": "smollm2", "messages": FRANCE, **body}, timeout=60
    )
    assert reply.status_code == 400 and fragment in reply.json()["error"]
