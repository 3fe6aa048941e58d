"""logit_bias and logprobs on the MLX engine end to end: the real server with SmolLM2 in float32 on
MLX, the openai SDK and the ollama SDK. MLX is slow on a CPU: a few short replies."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import ollama
import openai
import pytest

pytestmark = pytest.mark.slow

ONE_WORD = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_bias_bans_and_forces_and_greedy_logprobs_pick_the_top_token(mlx_server, smollm_f32):
    from kinfer.engines.mlx.tokenizer import MlxTokenizer

    client = openai.OpenAI(base_url=mlx_server.url + "/v1", api_key="unused", max_retries=0)
    greedy = client.chat.completions.create(
        model="smollm2", messages=ONE_WORD, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2
    )
    content = greedy.choices[0].logprobs.content
    assert "".join(lp.token for lp in content) == greedy.choices[0].message.content
    assert all(lp.top_logprobs[0].token == lp.token for lp in content)
    first = content[0]
    token = MlxTokenizer(smollm_f32.hf_dir).encode_plain(bytes(first.bytes).decode())
    assert len(token) == 1

    def sampled(bias: int) -> list[str]:
        reply = client.chat.completions.create(
            model="smollm2",
            messages=ONE_WORD,
            temperature=1.0,
            max_tokens=4,
            logprobs=True,
            logit_bias={str(token[0]): bias},
        )
        return [lp.token for lp in reply.choices[0].logprobs.content]

    with ThreadPoolExecutor(4) as pool:
        banned = list(pool.map(lambda _: sampled(-100), range(8)))
    assert all(replies for replies in banned) and first.token not in {t for r in banned for t in r}
    assert sampled(100) == [first.token] * 4


def test_ollama_chat_streams_logprobs_on_mlx(mlx_server):
    client = ollama.Client(host=mlx_server.url)
    options = {"temperature": 0, "num_predict": 6, "repeat_penalty": 1.0}
    chunks = list(
        client.chat(
            model="smollm2", messages=ONE_WORD, options=options, stream=True, logprobs=True, top_logprobs=1
        )
    )
    text = "".join(c.message.content for c in chunks)
    assert "".join(lp.token for c in chunks for lp in (c.logprobs or ())) == text
