"""The llama.cpp engine's life: its native log goes to a Python logger, and close() is final."""

from __future__ import annotations

import logging

import pytest

from kinfer.engines.llama.engine import LlamaEngine
from kinfer.errors import EngineFailure
from tests.engines.llama.fixtures import chat_prompt, job, make_engine

__all__ = ["make_engine"]


def test_llama_cpp_logs_to_a_python_logger_and_not_to_stderr(make_engine, capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="kinfer.llama_cpp"):
        make_engine(rows=1, prefix_cache=False)

    messages = [r.getMessage() for r in caplog.records if r.name == "kinfer.llama_cpp"]
    assert any(m.startswith("llama_model_loader:") for m in messages)
    assert all(not m.endswith("\n") for m in messages), "fragments are joined into whole lines"
    _, err = capfd.readouterr()
    assert "llama_model_loader" not in err


def test_close_is_final_and_safe_to_repeat(make_engine):
    engine = make_engine(rows=2, prefix_cache=False)
    engine.submit(job("busy", chat_prompt(engine, "Tell me a story."), max_tokens=50))
    engine.step()

    engine.close()  # with a row still generating
    engine.close()

    assert not engine.has_work and engine.step() == []
    with pytest.raises(EngineFailure):
        engine.tokenize("hello")
    with pytest.raises(EngineFailure):
        engine.submit(job("late", (1, 2, 3)))


def test_a_file_llama_cpp_cannot_load_is_an_engine_failure(tmp_path):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("this is not a model")

    with pytest.raises(EngineFailure):
        LlamaEngine(not_gguf, name="broken")
    with pytest.raises(EngineFailure):
        LlamaEngine(tmp_path / "missing.gguf", name="missing")
