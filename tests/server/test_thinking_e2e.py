"""Think mode end to end on a tiny random-weight Qwen3 (MLX engine) with Qwen3's real template.

Asked to think, the prompt ends in the template's opener and the reply comes back as thinking;
told not to, the template's empty think block is rendered and the reply is content; saying nothing
gets the template's default (Qwen3: no block, the model decides).
"""

from __future__ import annotations

from pathlib import Path

import ollama
import openai
import pytest

from tests.fixtures.tiny_mlx import build_tiny_model
from tests.live_server import LiveServer, running_server, server_settings

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
ASK = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("kinfer-home")
    template = (TEMPLATES / "qwen3-0.6b.jinja").read_text()
    build_tiny_model(home / "models" / "tiny-qwen3", "qwen3", chat_template=template)
    with running_server(server_settings(home, parallel=2, ctx=512)) as server:
        yield server


@pytest.fixture(scope="module")
def client(qwen_server: LiveServer) -> ollama.Client:
    return ollama.Client(host=qwen_server.url)


def chat(client: ollama.Client, think):
    return client.chat(
        model="tiny-qwen3", messages=ASK, think=think, options={"temperature": 0, "num_predict": 8}
    )


def test_the_store_serves_the_directory_on_mlx(client: ollama.Client):
    assert "tiny-qwen3" in [m.model for m in client.list().models]
    assert "thinking" in client.show("tiny-qwen3").capabilities


def test_think_true_opens_a_think_block_and_the_reply_is_thinking(client: ollama.Client):
    default = chat(client, None)
    thinking = chat(client, True)
    assert thinking.prompt_eval_count == default.prompt_eval_count + 2  # "<think>" "\n"
    assert thinking.message.thinking
    assert thinking.message.content == ""


def test_think_false_renders_the_empty_block_and_the_reply_is_content(client: ollama.Client):
    default = chat(client, None)
    plain = chat(client, False)
    # "<think>\n\n</think>\n\n" is four tokens more than the bare generation prompt
    assert plain.prompt_eval_count > default.prompt_eval_count
    assert not plain.message.thinking
    assert plain.message.content


def test_openai_reasoning_effort_maps_to_think(qwen_server: LiveServer):
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="tiny-qwen3", messages=ASK, reasoning_effort="high", max_tokens=8, temperature=0
    )
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"]
    assert not message.content
    none = client.chat.completions.create(
        model="tiny-qwen3", messages=ASK, reasoning_effort="none", max_tokens=8, temperature=0
    )
    assert none.choices[0].message.content
    assert "reasoning_content" not in (none.choices[0].message.model_extra or {})
