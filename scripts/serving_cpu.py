"""What each thread of kinfer's server spends per streamed token: N streams of T tokens, CPU from /proc.

    python scripts/serving_cpu.py MODEL [STREAMS] [TOKENS]        # e.g. a tiny MLX dir, 64, 384
    LLAMA_SERVER=BINARY python scripts/serving_cpu.py MODEL.gguf 1 512   # llama.cpp's own server instead

Starts `kinfer --headless` on MODEL (a GGUF or a model directory) with STREAMS rows, warms it with one
short round, then streams STREAMS chats of TOKENS tokens each (EOS ignored, from the bench's client
processes) and prints, for the busiest threads of the server, their CPU seconds over the round and per
generated token. MAIN is the event loop (HTTP, SSE, the scheduler's callbacks); at one chunk per token
its microseconds per token bound how many tokens a second the server can stream whatever the engine
does (issue 20: 256 streams at ~90 steps a second are ~23,000 chunks a second). Linux only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from kinfer.bench.load import make_client
from kinfer.bench.prompts import prompt_text
from kinfer.bench.servers import start_kinfer, start_llama_server
from kinfer.bench.sweep import run_level

SHOWN = 5


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of every thread of `pid`, by thread id ("MAIN" for the main one)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out["MAIN" if task.name == str(pid) else task.name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


async def measure(target, pid: int, streams: int, tokens: int) -> None:
    def chats(seed: int, words: int):
        return [([{"role": "user", "content": prompt_text(words, seed + i)}], 0) for i in range(streams)]

    async with make_client(streams) as client:
        await run_level(client, target, chats(0, 20), concurrency=streams, max_tokens=8)
        before = thread_cpu(pid)
        level = await run_level(client, target, chats(1000, 20), concurrency=streams, max_tokens=tokens)
        after = thread_cpu(pid)
    generated = level.completion_tokens
    print(f"streams={streams} tokens={generated} wall={level.wall_s:.2f}s tok/s={level.aggregate_tps:.0f}")
    spent = sorted(((after[t] - before.get(t, 0.0), t) for t in after), reverse=True)
    for seconds, thread in spent[:SHOWN]:
        print(f"  {thread:8s} {seconds:6.2f} s CPU  {seconds / max(generated, 1) * 1e6:6.1f} us per token")


def main() -> None:
    model = Path(sys.argv[1])
    streams = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 384
    logs = Path("/tmp/serving-cpu")
    if os.environ.get("LLAMA_SERVER"):  # the peer, for its HTTP thread's CPU a token beside kinfer's loop
        binary = Path(os.environ["LLAMA_SERVER"])
        server = start_llama_server(binary, model, parallel=streams, ctx=512 + tokens, log_dir=logs)
    else:
        server = start_kinfer(weights=model, parallel=streams, ctx=512 + tokens, log_dir=logs)
    try:
        asyncio.run(measure(server.target, server.pid, streams, tokens))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
