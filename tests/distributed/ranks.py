"""Two kinfer ranks on 127.0.0.1 as real processes (ring backend), as `mlx.launch` would start them:
each with its rank (MLX_RANK) and the ring's addresses (MLX_HOSTFILE), both running
`kinfer --headless --distributed HOSTFILE`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

HOSTFILE = {"backend": "ring", "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2}


def free_ports(n: int) -> list[int]:
    """n consecutive free ports (the ring's, then the heartbeat port below them)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port))
        except OSError:
            continue
        return list(range(base, base + n))
    raise RuntimeError("no free ports")


@dataclass
class Ranks:
    url: str
    processes: list[subprocess.Popen]
    logs: list[Path]

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=5)

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text(errors="replace")


def server_environ(home: Path) -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "KINFER_HOME": str(home),
        "OLLAMA_MODELS": str(home / "no-ollama"),
        "MLX_DISABLE_COMPILE": "1",
    }


@contextmanager
def two_ranks(home: Path, model: str, *args: str, timeout: float = 120.0) -> Iterator[Ranks]:
    """Start rank 1 and rank 0 (HTTP on a free port); wait until rank 0 has loaded `model`."""
    ring0, ring1, http_port, beat_port = free_ports(4)
    ring = [[f"127.0.0.1:{ring0}"], [f"127.0.0.1:{ring1}"]]
    (home / "hosts.json").write_text(json.dumps(HOSTFILE))
    (home / "ring.json").write_text(json.dumps(ring))
    command = [
        sys.executable, "-m", "kinfer", "--headless", "--distributed", str(home / "hosts.json"),
        "--model", model, "--port", str(http_port), "--distributed-port", str(beat_port), *args,
    ]  # fmt: skip
    processes, logs = [], []
    try:
        for rank in (1, 0):
            log = home / f"rank{rank}.log"
            env = {**server_environ(home), "MLX_RANK": str(rank), "MLX_HOSTFILE": str(home / "ring.json")}
            with log.open("wb") as out:
                processes.insert(0, subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
            logs.insert(0, log)
        ranks = Ranks(f"http://127.0.0.1:{http_port}", processes, logs)
        wait_loaded(ranks.url, model, processes, timeout)
        yield ranks
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_loaded(url: str, model: str, processes: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise RuntimeError(f"a rank exited early: {[p.returncode for p in processes]}")
        try:
            if model in httpx.get(url + "/health", timeout=2).json().get("loaded", []):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{model} did not load across ranks in {timeout:.0f}s")
