"""The bench against a real kinfer serving the bundled SmolLM2 (llama.cpp), at small sizes.

No timing is asserted: these check that the numbers exist, that token counts come from usage, that
generation runs to max_tokens, and that the prefix scenario sees kinfer reuse the shared prompt.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kinfer.bench.clients import Target, stream_chat
from kinfer.bench.prefix import PrefixConfig, run_prefix
from kinfer.bench.servers import equal_work_body
from kinfer.bench.sweep import SweepConfig, run_sweep
from kinfer.cli import main
from tests.live_server import LiveServer, running_server, server_settings

pytestmark = pytest.mark.slow
MODEL = "smollm2:135m"


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    try:
        # one llama.cpp thread: on a busy 2-core machine two threads stall on ggml's barrier
        with running_server(server_settings(home, parallel=2, ctx=2048, threads=1)) as server:
            yield server
    finally:
        mp.undo()


def kinfer_target(server: LiveServer, dialect: str = "openai") -> Target:
    return Target("kinfer", server.url, dialect, model=MODEL, extra_body=equal_work_body("kinfer", dialect))


def test_a_small_sweep_runs_every_request_to_max_tokens(smol_server):
    config = SweepConfig(concurrency=(1, 2), prompt_tokens=64, max_tokens=8)
    run = asyncio.run(run_sweep(kinfer_target(smol_server), config))
    assert run.sizer.calibrated and run.notes == ()
    assert [level.concurrency for level in run.levels] == [1, 2]
    for level in run.levels:
        assert level.requests == level.concurrency and level.errors == 0
        # ignore_eos: every reply is exactly max_tokens long, counted from usage
        assert level.completion_tokens == 8 * level.requests
        assert level.short_replies == 0 and level.usage_sources == ("usage",)
        # the calibrated prompts land near the size asked for (the real size comes from usage)
        assert 48 <= level.prompt_tokens / level.ok <= 80
        assert level.aggregate_tps > 0 and level.ttft_p50 is not None and level.stream_tps_p50 is not None
        # the in-process server has no PID of its own here; /metrics still reports the engine
        assert level.memory.engine_bytes.get("kv", 0) > 0 and level.memory.rss_bytes is None


@pytest.mark.parametrize("dialect", ["ollama", "anthropic"])
def test_the_other_dialects_report_usage_too(smol_server, dialect):
    async def one():
        async with httpx.AsyncClient(timeout=120) as client:
            messages = [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Count to 50."},
            ]
            return await stream_chat(client, kinfer_target(smol_server, dialect), messages, 6)

    result = asyncio.run(one())
    assert result.ok, result.error
    assert result.usage_source == "usage"
    assert 0 < result.completion_tokens <= 6 and result.prompt_tokens > 10
    assert result.ttft is not None and result.text


def test_the_prefix_scenario_sees_kinfer_reuse_the_conversation(smol_server):
    config = PrefixConfig(system_tokens=400, turn_tokens=24, max_tokens=8)
    run = asyncio.run(run_prefix(kinfer_target(smol_server), config))
    names = [s.name for s in run.steps]
    assert names == ["turn 1 (cold)", "turn 2", "turn 3", "new conversation"]
    assert all(s.result.ok for s in run.steps), run.notes
    cold, turn2, turn3, fresh = (s.result for s in run.steps)
    assert cold.prompt_tokens >= 400
    # each later turn reuses at least the conversation before its new user message
    assert turn2.cached_tokens >= cold.prompt_tokens - 8
    assert turn3.cached_tokens > turn2.cached_tokens
    # a new conversation on the same system prompt reuses the system prompt
    assert fresh.cached_tokens >= 380


def test_the_command_benchmarks_a_running_server_and_writes_json(smol_server, tmp_path: Path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--url", smol_server.url, "--model", MODEL, "--concurrency", "1,2"]
    argv += ["--max-tokens", "6", "--prompt-tokens", "48", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("machine: ")
    assert "agg tok/s" in printed and "aggregate tok/s" in printed  # the table and the plot
    data = json.loads(out.read_text())
    assert data["kind"] == "kinfer-bench" and "kinfer bench" in data["command"]
    (run,) = data["runs"]
    assert run["target"]["url"] == smol_server.url and run["target"]["model"] == MODEL
    assert [lv["concurrency"] for lv in run["levels"]] == [1, 2]
    assert [lv["completion_tokens"] for lv in run["levels"]] == [6, 12]


def test_the_command_starts_kinfer_itself_and_reports_its_memory(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    out = tmp_path / "bench.json"
    argv = ["bench", "--home", str(tmp_path / "home"), "--model", MODEL, "--threads", "1"]
    argv += ["--concurrency", "2", "--max-tokens", "4", "--prompt-tokens", "32", "--json", str(out)]
    argv += ["--logs", str(tmp_path / "logs")]
    assert main(argv) == 0
    (run,) = json.loads(out.read_text())["runs"]
    level = run["levels"][0]
    assert level["errors"] == 0 and level["completion_tokens"] == 8
    # the bench knows the PID of a server it started: RSS is measured
    assert run["target"]["pid"] and level["memory"]["rss_bytes"] > 50 * 2**20
    # and the server was stopped afterwards
    assert "listening on" in next((tmp_path / "logs").glob("kinfer-*.log")).read_text()
    with pytest.raises(httpx.HTTPError):
        httpx.get(run["target"]["url"] + "/health", timeout=2)
