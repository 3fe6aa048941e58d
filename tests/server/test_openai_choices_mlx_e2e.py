"""OpenAI's `n` on the MLX engine end to end: the real server with SmolLM2 in float32 on MLX, the
official SDK. The choices share one prefill (KV blocks and state copied, not recomputed)."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Write one sentence about a fox and a crow."}]
SEEDED = {"temperature": 1.0, "top_p": 1.0, "seed": 5, "max_tokens": 16}


@pytest.fixture(scope="module")
def client(mlx_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=mlx_server.url + "/v1", api_key="unused", max_retries=0)


def computed(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(re.search(r"^kinfer_prompt_tokens_computed_total\{[^}]*\} (\S+)$", text, re.M)[1])


def test_four_seeded_choices_differ_share_one_prefill_and_repeat(mlx_server, client):
    client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=1)  # loads the model
    before = computed(mlx_server)
    reply = client.chat.completions.create(model="smollm2", messages=STORY, n=4, **SEEDED)

    texts = [choice.message.content for choice in reply.choices]
    assert len(set(texts)) == 4, texts
    cached = reply.usage.prompt_tokens_details.cached_tokens
    # once, not four times (MLX feeds a prompt's last token in each row's first decode step)
    assert computed(mlx_server) - before == reply.usage.prompt_tokens - cached - 1
    again = client.chat.completions.create(model="smollm2", messages=STORY, n=4, **SEEDED)
    assert [choice.message.content for choice in again.choices] == texts

    chunks = list(client.chat.completions.create(model="smollm2", messages=STORY, n=4, stream=True, **SEEDED))
    streamed, finishes = ["" for _ in range(4)], [0] * 4
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            finishes[choice.index] += choice.finish_reason is not None
    assert streamed == texts and finishes == [1, 1, 1, 1]


def test_greedy_choices_are_the_single_greedy_reply(client):
    greedy = {"temperature": 0, "max_tokens": 16}
    single = client.chat.completions.create(model="smollm2", messages=STORY, **greedy)
    both = client.chat.completions.create(model="smollm2", messages=STORY, n=2, **greedy)

    assert [c.message.content for c in both.choices] == [single.choices[0].message.content] * 2
