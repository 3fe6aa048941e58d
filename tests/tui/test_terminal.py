"""`kinfer` in a real terminal (tmux, 120x36): the dashboard draws, the server answers, `q` stops both.

The real CLI, the real bundled SmolLM2 on llama.cpp and curl-like HTTP from outside the process;
what the test reads is what a person would see (`tmux capture-pane`).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TMUX = shutil.which("tmux")
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 180  # upper bounds for a loaded machine, not timing assertions
# the console script when the package is installed, else the same entry point through -m
SCRIPT = Path(sys.executable).with_name("kinfer")
KINFER = str(SCRIPT) if SCRIPT.exists() else f"{sys.executable} -m kinfer"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(TMUX is None, reason="tmux is missing (apt-get install -y tmux)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Terminal:
    """A tmux server of our own (its own socket), so the test never touches the user's sessions."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.args = [TMUX, "-L", name, "-f", os.devnull]
        self.env = env

    def tmux(self, *args: str) -> str:
        done = subprocess.run([*self.args, *args], env=self.env, capture_output=True, text=True, check=True)
        return done.stdout

    def start(self, command: str, size: tuple[int, int]) -> None:
        width, height = size
        self.tmux(
            "new-session", "-d", "-s", "main", "-x", str(width), "-y", str(height), "-c", str(ROOT), command
        )

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "main")

    def wait_for(self, pattern: str, what: str) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; the screen was:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([*self.args, "kill-server"], env=self.env, capture_output=True)


@pytest.fixture
def terminal(tmp_path: Path):
    env = {
        **os.environ,
        "OLLAMA_MODELS": str(tmp_path / "no-ollama"),
        "HF_HUB_OFFLINE": "1",
        "TERM": "xterm-256color",
    }
    env.pop("TMUX", None)
    term = Terminal(f"kinfer-test-{os.getpid()}", env)
    yield term
    term.close()


def test_kinfer_serves_while_the_dashboard_shows_the_request(terminal: Terminal, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = (
        f"{sys.executable} -m kinfer --port {port} --home {tmp_path / 'home'}; echo EXITED $?; sleep 600"
    )
    terminal.start(command, (120, 36))

    terminal.wait_for(rf"kinfer\s+{re.escape(url)}", "the dashboard's status line")
    terminal.wait_for(r"smollm2:135m\s+94 MiB\s+llama\.cpp\s+bundled", "the store panel")

    tags = httpx.get(url + "/api/tags", timeout=30)
    assert tags.status_code == 200
    assert [m["name"] for m in tags.json()["models"]] == ["smollm2:135m"]

    body = {
        "model": "smollm2:135m",
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": False,
        "options": {"num_predict": 8, "temperature": 0},
    }
    reply = httpx.post(url + "/api/chat", json=body, timeout=WAIT_S)
    assert reply.status_code == 200
    generated = reply.json()["eval_count"]

    screen = terminal.wait_for(rf"ollama\s+\d+\+{generated} (stop|length)", "the request in the log")
    assert re.search(r"●.\s+smollm2:135m", screen), screen  # the model shows as loaded
    assert re.search(r"done\s+1\b", screen), screen  # the gauges counted it

    terminal.tmux("send-keys", "-t", "main", "q")
    terminal.wait_for(r"EXITED 0", "kinfer to exit cleanly")
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/api/tags", timeout=5)
