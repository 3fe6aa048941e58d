"""The real agent CLIs, Claude Code and Codex, pointed at a kinfer server on 127.0.0.1.

`scripts/setup.sh test` installs the pinned npm packages into `.venv/agents` (AGENTS_DIR). Each run
gets its own HOME (and CODEX_HOME), no network but the server, and a timeout; the environment is the
one /work/shared/notes/agents.md found working.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.live_server import LiveServer

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO / ".venv" / "agents"  # scripts/setup.sh test: npm install --prefix .venv/agents
CLAUDE_CODE = "@anthropic-ai/claude-code"
CODEX = "@openai/codex"
MODEL = "smollm2"
RUN_TIMEOUT_S = 180


def agent_binary(name: str) -> Path:
    """The installed CLI; skipped (loudly) without node, failed when node is there but the CLI is not."""
    if shutil.which("node") is None:
        pytest.skip(f"SKIPPED LOUDLY: node is not installed, so the real {name} CLI cannot run")
    path = AGENTS_DIR / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup.sh test (it installs the pinned agent CLIs)")
    return path


def finished_requests(server: LiveServer) -> list[str]:
    """Ids of the generation requests the scheduler finishes from now on, answered or refused."""
    seen: list[str] = []
    server.runtime.scheduler.listeners.append(lambda stream: seen.append(stream.job_id))
    return seen


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), NO_COLOR="1", CI="1", TERM="dumb")
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


@dataclass(frozen=True)
class ClaudeResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        """The `--output-format json` result object (the last JSON line Claude Code printed)."""
        for line in reversed(self.stdout.strip().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"no JSON result from Claude Code:\n{self.stdout}\n{self.stderr}")


def run_claude(url: str, prompt: str, *args: str, home: Path, cwd: Path | None = None) -> ClaudeResult:
    """`claude -p PROMPT --output-format json ARGS` against the server at `url`, every model set to ours."""
    home.mkdir(parents=True, exist_ok=True)
    env = _base_env(home)
    env.update(
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY="sk-ant-unused",
        ANTHROPIC_MODEL=MODEL,
        ANTHROPIC_SMALL_FAST_MODEL=MODEL,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
        ANTHROPIC_DEFAULT_SONNET_MODEL=MODEL,
        ANTHROPIC_DEFAULT_OPUS_MODEL=MODEL,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
    )
    command = [str(agent_binary("claude")), "-p", prompt, "--output-format", "json", *args]
    done = subprocess.run(
        command,
        cwd=cwd or home,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return ClaudeResult(done.returncode, done.stdout, done.stderr)


CODEX_CONFIG = """\
model = "{model}"
model_provider = "kinfer"
approval_policy = "never"
sandbox_mode = "{sandbox}"
check_for_update_on_startup = false

[model_providers.kinfer]
name = "kinfer"
base_url = "{url}/v1"
wire_api = "responses"

[analytics]
enabled = false
"""


@dataclass(frozen=True)
class CodexResult:
    returncode: int
    stdout: str
    stderr: str
    last_message: str  # what `--output-last-message` wrote: the agent's final answer


def run_codex(url: str, prompt: str, *, home: Path, sandbox: str = "read-only") -> CodexResult:
    """`codex exec PROMPT` with a Responses provider at `url` (config as agents.md gives it)."""
    codex_home = home / "codex-home"
    work = home / "work"
    codex_home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=MODEL, sandbox=sandbox, url=url))
    last = home / "last-message.txt"
    env = _base_env(home)
    env["CODEX_HOME"] = str(codex_home)
    command = [
        str(agent_binary("codex")),
        "exec",
        "--skip-git-repo-check",
        "--output-last-message",
        str(last),
        prompt,
    ]
    done = subprocess.run(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    message = last.read_text() if last.exists() else ""
    return CodexResult(done.returncode, done.stdout, done.stderr, message)
