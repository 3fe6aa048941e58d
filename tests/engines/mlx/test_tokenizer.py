"""Reading a model directory's tokenizer and chat template for the MLX engine."""

from __future__ import annotations

import json
import shutil

import pytest

from kinfer.engines.mlx.model import read_chat_template
from kinfer.engines.mlx.tokenizer import MlxTokenizer
from kinfer.engines.stop_strings import Utf8Decoder
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.fixtures.tiny_mlx import build_tiny_model

TEXTS = ("café 東京 🙂", "tabs\tand\nnewlines\n\n", "don't won't it's", "x = 1234567 + 89")


def test_special_tokens_are_parsed_and_there_is_no_bos_unless_asked(tiny_qwen3):
    tok = MlxTokenizer(tiny_qwen3)
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.token_id("<|im_start|>") and ids[-1] == tok.token_id("<|im_end|>")
    assert not tok.adds_bos and tok.bos_token == ""


@pytest.mark.parametrize("text", TEXTS)
def test_detokenize_round_trips(tiny_qwen3, text):
    tok = MlxTokenizer(tiny_qwen3)
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_make_whole_characters(tiny_qwen3, text):
    """Token by token, the byte pieces joined by the UTF-8 decoder never show half a character."""
    tok = MlxTokenizer(tiny_qwen3)
    decoder = Utf8Decoder()
    chunks = [decoder.feed(tok.piece(t)) for t in tok.encode(text)]
    assert "".join(chunks) + decoder.flush() == text
    assert not any("\ufffd" in c for c in chunks)
    assert len(tok.encode("東京🙂")) > 2  # the byte-level vocabulary really does split characters


def test_bos_is_added_once(tmp_path):
    path = build_tiny_model(tmp_path / "bos", "llama", add_bos=True)
    tok = MlxTokenizer(path)
    bos = tok.token_id("<|endoftext|>")
    assert tok.adds_bos and tok.bos_token == "<|endoftext|>"
    assert tok.encode("hello")[0] == bos
    assert tok.encode("<|endoftext|>hello").count(bos) == 1  # a template that writes BOS itself


def test_chat_template_sources(tmp_path, tiny_qwen3):
    model = tmp_path / "m"
    shutil.copytree(tiny_qwen3, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    assert read_chat_template(model, config) == config["chat_template"]
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert read_chat_template(model, {"chat_template": named}) == "D"
    (model / "chat_template.jinja").write_text("{{ messages }}")
    assert read_chat_template(model, config) == "{{ messages }}"  # the newer file wins
    assert read_chat_template(tmp_path, {}) is None


def test_templates_given_to_the_fixture_reach_the_model_info(tmp_path, make_mlx):
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}<think>\n"
    engine = make_mlx(build_tiny_model(tmp_path / "t", "qwen3", chat_template=template))
    assert engine.info.chat_template == template
