"""Start the servers a benchmark measures, each on a free port as a subprocess, and stop them after.

- kinfer: `python -m kinfer --headless` (a store model by name, or any GGUF file / HF directory given
  by path: it is linked into a throwaway KINFER_HOME), or the dashboard inside a tmux session.
- llama-cpp-python's own server: `python -m llama_cpp.server` (needs the `bench` extra: fastapi,
  uvicorn, sse-starlette, starlette-context, pydantic-settings). It serves one request at a time;
  `--interrupt_requests False` keeps a new request from cutting the one being streamed.
- mlx-lm's server: `mlx_lm.server --model DIR` (continuous batching up to `--decode-concurrency`).

Every server gets the same "generate to max_tokens" treatment (see `equal_work_body`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from kinfer.bench.clients import Dialect, Target

log = logging.getLogger(__name__)

ServerKind = Literal["kinfer", "llama-cpp-server", "mlx-lm-server", "llama-server"]
SERVER_KINDS: tuple[ServerKind, ...] = ("kinfer", "llama-cpp-server", "mlx-lm-server", "llama-server")
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 20.0
END_TOKEN_BIAS = -100.0  # logit bias that keeps end-of-turn tokens from ever being drawn
GGUF_CONTROL_TOKEN = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
LOG_TAIL_CHARS = 3000
OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)


@dataclass
class LaunchedServer:
    """A server process the bench started; `stop()` (or leaving the `with` block) ends it."""

    kind: ServerKind
    target: Target
    process: subprocess.Popen | None
    log_path: Path
    command: tuple[str, ...]
    cleanup: list[Path] = field(default_factory=list)
    tmux_session: str | None = None

    @property
    def pid(self) -> int | None:
        return self.target.pid

    def stop(self) -> None:
        if self.tmux_session is not None:
            if self.target.pid is not None:
                _signal(self.target.pid, signal.SIGTERM)
                _wait_gone(self.target.pid, STOP_TIMEOUT_S)
            subprocess.run(
                ["tmux", "kill-session", "-t", self.tmux_session], capture_output=True, check=False
            )
            self.tmux_session = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing it", self.target.label, STOP_TIMEOUT_S)
                self.process.kill()
                self.process.wait(5)
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)
        self.cleanup.clear()

    def __enter__(self) -> LaunchedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


def wait_ready(server: LaunchedServer, path: str, timeout: float = START_TIMEOUT_S) -> None:
    """Poll `path` until it answers 200; raise with the server's log if it exits or times out."""
    deadline = time.monotonic() + timeout
    url = server.target.url + path
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            raise RuntimeError(
                f"{server.target.label} exited with status {server.process.returncode} while starting:\n"
                f"{log_tail(server.log_path)}"
            )
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(
        f"{server.target.label} did not answer {url} in {timeout:.0f} s:\n{log_tail(server.log_path)}"
    )


def _spawn(
    kind: ServerKind,
    label: str,
    command: Sequence[str],
    port: int,
    *,
    dialect: Dialect,
    model: str | None,
    extra_body: Mapping[str, Any],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cleanup: list[Path] | None = None,
) -> LaunchedServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-{port}.log"
    log.info("starting %s: %s", label, shlex.join(command))
    with open(log_path, "wb") as sink:
        process = subprocess.Popen(
            list(command), stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    target = Target(
        label=label,
        url=f"http://127.0.0.1:{port}",
        dialect=dialect,
        model=model,
        extra_body=dict(extra_body),
        pid=process.pid,
    )
    return LaunchedServer(kind, target, process, log_path, tuple(command), cleanup or [])


# ---- kinfer -----------------------------------------------------------------------------------


def linked_home(weights: Path) -> tuple[Path, str]:
    """A throwaway KINFER_HOME whose store holds only `weights` (linked, not copied); (home, name)."""
    home = Path(tempfile.mkdtemp(prefix="kinfer-bench-home-"))
    (home / "models").mkdir()
    weights = weights.resolve()
    link = home / "models" / weights.name
    link.symlink_to(weights, target_is_directory=weights.is_dir())
    name = weights.stem if weights.is_file() else weights.name
    return home, name


def tree_env(tree: Path) -> dict[str, str]:
    """Environment for a kinfer server run from the source tree `tree` (a checkout of another commit, to
    compare two versions in one run): the tree first on PYTHONPATH, what PYTHONPATH held (a GPU machine's
    staged packages) after it, and PYTHONSAFEPATH so `python -m kinfer` does not import the cwd's kinfer."""
    path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "PYTHONSAFEPATH": "1"}


def kinfer_command(
    port: int,
    *,
    model: str | None,
    home: Path | None,
    parallel: int,
    ctx: int,
    threads: int,
    headless: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "kinfer",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--keep-alive",
        "-1",
    ]
    if headless:
        command.append("--headless")
    for flag, value in (("--home", home), ("--model", model)):
        if value:
            command += [flag, str(value)]
    for flag, number in (("--parallel", parallel), ("--ctx", ctx), ("--threads", threads)):
        if number:
            command += [flag, str(number)]
    return command + list(extra_args)


def start_kinfer(
    *,
    model: str | None = None,
    weights: Path | None = None,
    home: Path | None = None,
    parallel: int = 0,
    ctx: int = 0,
    threads: int = 0,
    dialect: Dialect = "openai",
    label: str = "kinfer",
    log_dir: Path,
    extra_args: Sequence[str] = (),
    dashboard: bool = False,
    env: Mapping[str, str] | None = None,
) -> LaunchedServer:
    """Start kinfer serving `model` (a store name) or `weights` (a path); wait for /health.

    `dashboard=True` runs the full dashboard in a detached tmux session instead of `--headless`, so
    the TUI really renders while the bench runs. `env`: more environment for the server (PYTHONPATH
    picks another source tree, to compare two versions of kinfer in one run).
    """
    cleanup: list[Path] = []
    env = dict(env or {})
    if weights is not None:
        home, model = linked_home(weights)
        cleanup.append(home)
        env["OLLAMA_MODELS"] = str(home / "no-ollama")  # borrow nothing: the listing stays one model
    port = free_port()
    command = kinfer_command(
        port,
        model=model,
        home=home,
        parallel=parallel,
        ctx=ctx,
        threads=threads,
        headless=not dashboard,
        extra_args=extra_args,
    )
    extra = equal_work_body("kinfer", dialect)
    if dashboard:
        server = _spawn_in_tmux(label, command, port, dialect=dialect, model=model, extra_body=extra, env=env)
        server.cleanup.extend(cleanup)
        server.log_path = log_dir / "dashboard.log"  # the TUI owns the terminal; no log to tail
    else:
        server = _spawn(
            "kinfer",
            label,
            command,
            port,
            dialect=dialect,
            model=model,
            extra_body=extra,
            log_dir=log_dir,
            env=env,
            cleanup=cleanup,
        )
    wait_ready(server, "/health")
    return server


def _spawn_in_tmux(
    label: str,
    command: Sequence[str],
    port: int,
    *,
    dialect: Dialect,
    model: str | None,
    extra_body: Mapping[str, Any],
    env: Mapping[str, str],
) -> LaunchedServer:
    if shutil.which("tmux") is None:
        raise RuntimeError("the dashboard run needs tmux (apt-get install tmux)")
    session = f"kinfer-bench-{port}"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    shell = f"exec env {exports} {shlex.join(command)}" if exports else f"exec {shlex.join(command)}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "48", shell], check=True)
    pane = subprocess.run(
        ["tmux", "display-message", "-p", "-t", session, "#{pane_pid}"],
        capture_output=True,
        text=True,
        check=True,
    )
    target = Target(
        label=label,
        url=f"http://127.0.0.1:{port}",
        dialect=dialect,
        model=model,
        extra_body=dict(extra_body),
        pid=int(pane.stdout.strip()),  # `exec` makes the pane's process kinfer itself
    )
    return LaunchedServer("kinfer", target, None, Path(os.devnull), tuple(command), tmux_session=session)


# ---- peers ------------------------------------------------------------------------------------


def start_llama_cpp_server(
    gguf: Path, *, ctx: int, threads: int, gpu_layers: int = 0, log_dir: Path, label: str = "llama-cpp-python"
) -> LaunchedServer:
    """llama-cpp-python's own OpenAI server on `gguf` (one request at a time)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(ctx),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_gpu_layers",
        str(gpu_layers),
        "--interrupt_requests",
        "False",
    ]
    server = _spawn(
        "llama-cpp-server",
        label,
        command,
        port,
        dialect="openai",
        model=None,
        extra_body=equal_work_body("llama-cpp-server", "openai", gguf),
        log_dir=log_dir,
    )
    wait_ready(server, "/v1/models")
    return server


def start_llama_server(
    binary: Path,
    gguf: Path,
    *,
    parallel: int,
    ctx: int,
    threads: int = 0,
    gpu_layers: int = 0,
    log_dir: Path,
    label: str = "llama-server",
    extra_args: Sequence[str] = (),
) -> LaunchedServer:
    """llama.cpp's own C++ server (`../shared/peers/llama-server.sh` builds it) on `gguf`: `parallel`
    slots of `ctx` tokens each; `threads` 0 leaves llama-server's own default."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-np", str(parallel), "-c", str(parallel * ctx), "-ngl", str(gpu_layers)]
    if threads:
        command += ["-t", str(threads), "-tb", str(threads)]
    server = _spawn(
        "llama-server",
        label,
        [*command, *extra_args],
        port,
        dialect="openai",
        model=None,
        extra_body=equal_work_body("llama-server", "openai", gguf),
        log_dir=log_dir,
    )
    wait_ready(server, "/health")
    return server


def mlx_lm_server_command(model_dir: Path, port: int, concurrency: int) -> list[str]:
    script = Path(sys.executable).with_name("mlx_lm.server")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "mlx_lm.server"]
    return [
        *base,
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--decode-concurrency",
        str(max(32, concurrency)),
        "--prompt-concurrency",
        str(max(8, min(concurrency, 32))),
    ]


def start_mlx_lm_server(
    model_dir: Path, *, concurrency: int = 32, log_dir: Path, label: str = "mlx_lm.server"
) -> LaunchedServer:
    """mlx-lm's own server on an HF-style directory, OpenBLAS preloaded on Linux CPUs as kinfer does."""
    port = free_port()
    env = {"HF_HUB_OFFLINE": "1"}
    blas = next((p for p in OPENBLAS_PATHS if os.path.exists(p)), None)
    if blas and sys.platform.startswith("linux"):
        env["LD_PRELOAD"] = blas
    server = _spawn(
        "mlx-lm-server",
        label,
        mlx_lm_server_command(model_dir, port, concurrency),
        port,
        dialect="openai",
        model=None,  # mlx_lm maps a missing model to the one given on its command line
        extra_body=equal_work_body("mlx-lm-server", "openai", model_dir),
        log_dir=log_dir,
        env=env,
    )
    wait_ready(server, "/health")
    return server


# ---- equal work -------------------------------------------------------------------------------


def equal_work_body(kind: ServerKind, dialect: Dialect, weights: Path | None = None) -> dict[str, Any]:
    """What to add to each request so the server generates exactly max_tokens.

    kinfer (OpenAI and Anthropic dialects) takes `ignore_eos`; Ollama's dialect has no such switch.
    llama-cpp-python and mlx_lm have no ignore_eos, so their end-of-turn tokens get a -100 logit bias.
    """
    if kind == "kinfer":
        return {"ignore_eos": True} if dialect in ("openai", "anthropic") else {}
    if kind == "llama-server":
        return {"ignore_eos": True}
    if weights is None:
        return {}
    return {"logit_bias": {str(t): END_TOKEN_BIAS for t in end_token_ids(weights)}}


def end_token_ids(weights: Path) -> list[int]:
    """Token ids that can end a reply: the control tokens of a GGUF, or the special added tokens and
    eos ids of an HF directory."""
    if weights.is_dir():
        return _hf_end_tokens(weights)
    return _gguf_end_tokens(weights)


def _hf_end_tokens(folder: Path) -> list[int]:
    ids: set[int] = set()
    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file():
        for token in json.loads(tokenizer.read_text(encoding="utf-8")).get("added_tokens", []):
            if token.get("special"):
                ids.add(int(token["id"]))
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        config = json.loads(path.read_text(encoding="utf-8"))
        for section in (config, config.get("text_config") or {}):
            eos = section.get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return sorted(ids)


def _gguf_end_tokens(path: Path) -> list[int]:
    from gguf import GGUFReader  # slow (it decodes the whole vocabulary): imported only here

    reader = GGUFReader(str(path))
    ids: set[int] = set()
    types = reader.fields.get("tokenizer.ggml.token_type")
    if types is not None:
        ids.update(i for i, part in enumerate(types.data) if int(types.parts[part][0]) == GGUF_CONTROL_TOKEN)
    for key in ("eos", "eot", "eom"):
        value = reader.fields.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            ids.add(int(value.parts[value.data[0]][0]))
    return sorted(ids)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
