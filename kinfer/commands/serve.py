"""`kinfer` / `kinfer --headless` (serve), `kinfer ps` and `kinfer run` (clients of a running server)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time

import httpx

from kinfer.config import Settings, settings_environ
from kinfer.engines.memory_account import PARTS
from kinfer.store.progress import format_bytes

log = logging.getLogger(__name__)

SERVER_START_TIMEOUT_S = 120


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    ps = sub.add_parser("ps", parents=parents, help="what the running server has loaded")
    ps.add_argument("--json", action="store_true", help="print JSON")
    ps.set_defaults(handler=run_ps)
    run = sub.add_parser("run", parents=parents, help="chat with a model through a running server")
    run.add_argument("name", help="model name (or a unique prefix)")
    run.add_argument("prompt", nargs="*", help="one-shot prompt; omit for an interactive chat")
    run.add_argument("--think", choices=("on", "off"), help="ask for thinking, or turn it off")
    run.set_defaults(handler=run_chat)
    dist = sub.add_parser(
        "distributed", parents=parents, help="print the commands that start a model's ranks across hosts"
    )
    dist.add_argument("hostfile", help="mlx.launch's hostfile JSON (docs/distributed.md)")
    dist.add_argument("serve_args", nargs="*", help="more kinfer flags for every rank (after --)")
    dist.set_defaults(handler=run_distributed)


# ---- serving -----------------------------------------------------------------------------------


def serve(settings: Settings, *, headless: bool) -> int:
    from kinfer.libllama_first import load_libllama_first

    load_libllama_first()  # before anything loads numpy: CUDA llama.cpp crashes otherwise (see there)
    from kinfer.runtime import Runtime
    from kinfer.server.http import bind_socket

    cluster = None
    if settings.distributed is not None:
        cluster, settings = _join(settings)
        if cluster.rank != 0:
            return cluster.follow(settings)
    runtime = Runtime.build(settings, engine_factory=cluster.engine_factory if cluster else None)
    runtime.cluster = cluster
    if cluster is not None:  # a lost rank ends the replies even while rank 0 waits in a collective
        runtime.scheduler.fault = lambda: cluster.health.error
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"kinfer: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    for warning in runtime.store.warnings:
        log.warning("%s", warning)
    if not headless:
        try:
            from kinfer.tui.app import run_dashboard
        except ImportError as exc:
            print(f"kinfer: the dashboard is unavailable ({exc}); serving headless", file=sys.stderr)
        else:
            return run_dashboard(runtime, sock)
    return asyncio.run(_serve_headless(runtime, sock, host, port))


async def _serve_headless(runtime, sock, host: str, port: int) -> int:
    from kinfer.server.http import serve as serve_runtime

    shutdown, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        # the first signal drains (replies in flight get --shutdown-grace seconds); a second one hurries
        if shutdown.is_set():
            hurry.set()
            return
        grace = runtime.settings.shutdown_grace
        print(f"shutting down: replies in flight have {grace:g}s to finish (signal again to end them now)")
        shutdown.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    default = runtime.store.default_model(runtime.settings.model)
    print(f"kinfer listening on http://{host}:{port}", flush=True)
    if default is not None:
        print(f"default model: {default.name} ({default.kind_label})", flush=True)
    else:
        print("the store is empty: `kinfer pull OWNER/REPO` to add a model", flush=True)
    if runtime.cluster is not None:  # the other ranks wait for the model: load it now, for good
        preload = asyncio.create_task(runtime.scheduler.load(runtime.settings.model, keep_alive=-1))
        preload.add_done_callback(_log_preload)
    try:
        await serve_runtime(runtime, sock, shutdown, hurry)
    finally:
        if runtime.cluster is not None:
            runtime.cluster.close()
    return 0


def _join(settings: Settings):
    """This process's rank; a distributed server keeps its one model loaded (the ranks hold it)."""
    from dataclasses import replace

    from kinfer.distributed.cluster import Cluster
    from kinfer.errors import KinferError

    try:
        cluster = Cluster(settings)
    except KinferError as exc:
        raise SystemExit(f"kinfer: {exc}") from None
    except (RuntimeError, OSError) as exc:  # MLX could not join the ring, or the health port is taken
        raise SystemExit(f"kinfer: cannot join the distributed group: {exc}") from None
    return cluster, replace(settings, keep_alive="-1", max_loaded=1)


def _log_preload(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("loading the model across ranks failed: %s", task.exception())


def run_distributed(args: argparse.Namespace, settings: Settings) -> int:
    from kinfer.distributed.hostfile import launch_commands, read_hostfile
    from kinfer.errors import KinferError

    try:
        hostfile = read_hostfile(args.hostfile)
    except KinferError as exc:
        print(f"kinfer: {exc}", file=sys.stderr)
        return 1
    print(launch_commands(hostfile, args.serve_args))
    return 0


# ---- clients of a running server ---------------------------------------------------------------


def base_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}"


def headers(settings: Settings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


def server_is_up(settings: Settings) -> bool:
    try:
        return (
            httpx.get(base_url(settings) + "/health", timeout=2, headers=headers(settings)).status_code == 200
        )
    except httpx.HTTPError:
        return False


def run_ps(args: argparse.Namespace, settings: Settings) -> int:
    try:
        reply = httpx.get(base_url(settings) + "/api/ps", timeout=10, headers=headers(settings))
    except httpx.HTTPError:
        print(
            f"kinfer: no server answers at {base_url(settings)} (start one with `kinfer --headless`)",
            file=sys.stderr,
        )
        return 1
    if reply.status_code == 401:
        hint = "the key given was refused" if settings.api_key else "set KINFER_API_KEY or pass --api-key"
        print(f"kinfer: the server at {base_url(settings)} needs an API key (401): {hint}", file=sys.stderr)
        return 1
    if reply.status_code != 200:
        print(f"kinfer: the server at {base_url(settings)} answered {reply.status_code}", file=sys.stderr)
        return 1
    models = reply.json().get("models", [])
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    if not models:
        print("no model loaded")
        return 0
    print(f"{'NAME':40} {'SIZE':>10} {'CONTEXT':>8} {'MEMORY':>22}  UNTIL")
    for m in models:
        size = f"{m['size'] / 1e6:.0f} MB"
        until = "forever" if m["expires_at"].startswith("0001") else m["expires_at"]
        memory = m.get("memory") or {}
        held = format_bytes(memory["total"]) if "total" in memory else "-"
        if memory.get("budget"):
            held += f" of {format_bytes(memory['budget'])}"
        print(f"{m['name']:40} {size:>10} {m.get('context_length', 0):>8} {held:>22}  {until}")
        parts = [f"{part} {format_bytes(memory[part])}" for part in PARTS if memory.get(part)]
        if parts:
            print("  " + "  ".join(parts))
    return 0


def ensure_server(settings: Settings) -> subprocess.Popen | None:
    """Use the server that answers, or start `kinfer --headless` in the background and wait for it."""
    if server_is_up(settings):
        return None
    # every setting travels, the API key and --origins / --allowed-hosts above all; through the
    # environment, so the key never shows in the process list
    environ = {**os.environ, **settings_environ(settings)}
    print(f"starting kinfer on {base_url(settings)} ...", file=sys.stderr)
    process = subprocess.Popen(
        [sys.executable, "-m", "kinfer", "--headless"],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"kinfer: the server exited with status {process.returncode}")
        if server_is_up(settings):
            return process
        time.sleep(0.2)
    process.terminate()
    raise SystemExit("kinfer: the server did not start in time")


def stream_chat(settings: Settings, model: str, messages: list[dict], think: bool | None) -> str:
    """Send one chat turn and print it as it streams; returns the answer text."""
    body: dict = {"model": model, "messages": messages, "stream": True}
    if think is not None:
        body["think"] = think
    answer: list[str] = []
    thinking_open = False
    with httpx.stream(
        "POST", base_url(settings) + "/api/chat", json=body, timeout=None, headers=headers(settings)
    ) as reply:
        if reply.status_code != 200:
            reply.read()
            raise SystemExit(f"kinfer: {reply.json().get('error', reply.text)}")
        for line in reply.iter_lines():
            if not line:
                continue
            chunk = json.loads(line)
            if "error" in chunk:
                raise SystemExit(f"kinfer: {chunk['error']}")
            message = chunk.get("message", {})
            if message.get("thinking"):
                if not thinking_open:
                    sys.stdout.write("\x1b[2mThinking...\n")
                    thinking_open = True
                sys.stdout.write(message["thinking"])
            if message.get("content"):
                if thinking_open:
                    sys.stdout.write("\n...done thinking.\x1b[0m\n\n")
                    thinking_open = False
                sys.stdout.write(message["content"])
                answer.append(message["content"])
            sys.stdout.flush()
    if thinking_open:
        sys.stdout.write("\x1b[0m")
    sys.stdout.write("\n")
    return "".join(answer)


def run_chat(args: argparse.Namespace, settings: Settings) -> int:
    from kinfer.store.catalog import Store

    model = Store(settings.home).resolve(args.name).name  # fail fast on an unknown name
    think = None if args.think is None else args.think == "on"
    process = ensure_server(settings)
    try:
        if args.prompt:
            stream_chat(settings, model, [{"role": "user", "content": " ".join(args.prompt)}], think)
            return 0
        history: list[dict] = []
        print(f"chatting with {model}; /bye or Ctrl-D to leave", file=sys.stderr)
        while True:
            try:
                line = input(">>> ")
            except EOFError:
                print()
                return 0
            if line.strip() in ("/bye", "/exit", "/quit"):
                return 0
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            history.append({"role": "assistant", "content": stream_chat(settings, model, history, think)})
    finally:
        if process is not None:
            process.terminate()
