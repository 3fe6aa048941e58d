"""One stream's requests taken apart, kinfer against llama.cpp's own server, alternated.

    python scripts/one_stream_requests.py --llama-server BINARY [--gguf MODEL] [--requests 16]
        [--max-tokens 64] [--rounds 2] [--target llama-server --target kinfer --target "kinfer --threads 2"]

At one stream a sweep's aggregate tok/s is a few replies' wall time, which hides where a request's time
goes. This sends REQUESTS chats one after another (after three short warm-up replies) to each server in
turn, ROUNDS times, and prints per server and round the aggregate tok/s and the medians of: time to
first token, decode time a token, the last token to the reply's end, and the client's gap before its
next request. Both servers get the bench's equal-work body (EOS ignored), a ~80-token prompt each.
Each `--target` is one server: `llama-server`, or `kinfer` and its extra arguments (default: the two).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
from pathlib import Path

import httpx

from kinfer.bench.clients import stream_chat
from kinfer.bench.prompts import prompt_text
from kinfer.bench.servers import LaunchedServer, start_kinfer, start_llama_server
from kinfer.bench.stats import RequestResult
from kinfer.store.bundled import bundled_gguf

PROMPT_WORDS = 45  # ~80 tokens of SmolLM2's tokenizer
CTX = 1024


def start(target: str, args: argparse.Namespace) -> LaunchedServer:
    logs = Path("/tmp/one-stream-requests")
    name, *extra = target.split()
    if name == "llama-server":
        return start_llama_server(args.llama_server, args.gguf, parallel=1, ctx=CTX, log_dir=logs)
    return start_kinfer(weights=args.gguf, parallel=1, ctx=CTX, log_dir=logs, extra_args=extra)


async def send_in_turn(server: LaunchedServer, requests: int, max_tokens: int) -> list[RequestResult]:
    async with httpx.AsyncClient(timeout=120) as client:
        for seed in range(3):
            await stream_chat(client, server.target, chat(10_000 + seed), 8)
        return [await stream_chat(client, server.target, chat(seed), max_tokens) for seed in range(requests)]


def chat(seed: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt_text(PROMPT_WORDS, seed)}]


def summary(results: list[RequestResult]) -> str:
    median = statistics.median
    ttft = median(r.first_token - r.started for r in results)
    per_token = median((r.last_token - r.first_token) / max(r.completion_tokens - 1, 1) for r in results)
    tail = median(r.finished - r.last_token for r in results)
    gap = median(b.started - a.finished for a, b in itertools.pairwise(results))
    wall = results[-1].finished - results[0].started
    rate = sum(r.completion_tokens for r in results) / wall
    return (
        f"{rate:6.1f} tok/s  TTFT {ttft * 1e3:6.1f} ms  {per_token * 1e3:5.2f} ms a token  "
        f"tail {tail * 1e3:5.2f} ms  gap {gap * 1e3:5.2f} ms  ({results[0].prompt_tokens} prompt tokens)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-server", type=Path, required=True, help="llama.cpp's C++ llama-server")
    parser.add_argument("--gguf", type=Path, help="default: the bundled SmolLM2")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", action="append", help="llama-server, or kinfer [ARGS] (repeatable)")
    args = parser.parse_args()
    targets = args.target or ["llama-server", "kinfer"]
    if any((t.split() or [""])[0] not in ("llama-server", "kinfer") for t in targets):
        parser.error("a --target is llama-server, or kinfer and its arguments")
    if args.requests < 2:
        parser.error("--requests: at least 2 (the gap is between two requests)")
    args.gguf = args.gguf or bundled_gguf()
    if args.gguf is None:
        parser.error("no --gguf and the bundled model is not installed")
    for round_ in range(1, args.rounds + 1):
        for target in targets:
            server = start(target, args)
            try:
                results = asyncio.run(send_in_turn(server, args.requests, args.max_tokens))
            finally:
                server.stop()
            failed = [r.error for r in results if not r.ok]
            line = f"failed: {failed[0]}" if failed else summary(results)
            print(f"{target:20s} #{round_}  {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
