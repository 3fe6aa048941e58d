"""When each reply of a burst gets its first token and its last, llama-server against kinfer, alternated.

    python scripts/burst_timeline.py --llama-server .peers/build-cpu/bin/llama-server          # 16 streams
    python scripts/burst_timeline.py --llama-server BIN --streams 8 --rounds 3 --kinfer-args="--flash-attn on"
    python scripts/burst_timeline.py --llama-server BIN --tree before=/path/to/old/checkout --tree after=.

Starts each server in turn on the bundled SmolLM2 (`--streams` slots), warms it with one burst of
8-token replies (so the chat template's preamble is in each server's prompt cache, as it would be on
a server in use), then sends `--streams` chats at once (48 seeded words each, every reply 64 tokens,
greedy) and prints, per server: the level's wall time and aggregate tok/s, every reply's first-token
time (sorted), the last first token, the first and last reply's end, the decode rate while every row
streamed, and kinfer's prefix-pool counters from `/metrics`. Where `bench_peers.py` gives the
percentiles, this shows how a burst was admitted: all at once (llama-server) or a few per step.

`--tree NAME=DIR` runs kinfer from another source tree (a checkout of an older commit), repeatable;
without it the kinfer installed here runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kinfer.bench.clients import Target, chat_body, chat_path
from kinfer.bench.prompts import prompt_text
from kinfer.bench.servers import LaunchedServer, start_kinfer, start_llama_server, tree_env
from kinfer.store.bundled import bundled_gguf

WORDS = 48
REPLY = 64
POOL_METRICS = ("kinfer_prefix_hits", "kinfer_reused_prefix_tokens", "kinfer_prompt_tokens_computed")


async def stream_one(
    client: httpx.AsyncClient, target: Target, text: str, max_tokens: int, t0: float
) -> list[float]:
    """Arrival times (seconds after t0) of every content chunk of one streamed chat (OpenAI dialect)."""
    body = chat_body(target, [{"role": "user", "content": text}], max_tokens, stream=True)
    url, times = target.url + chat_path(target.dialect), []
    async with client.stream("POST", url, json=body, headers=target.headers()) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                times.append(time.perf_counter() - t0)
    return times


async def burst(target: Target, streams: int, max_tokens: int, seed: int) -> tuple[float, list[list[float]]]:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        texts = [prompt_text(WORDS, seed + i) for i in range(streams)]
        replies = await asyncio.gather(*(stream_one(client, target, t, max_tokens, t0) for t in texts))
        return time.perf_counter() - t0, list(replies)


def report(label: str, wall: float, replies: list[list[float]]) -> dict:
    firsts = sorted(r[0] for r in replies)
    ends = sorted(r[-1] for r in replies)
    tokens = len(replies) * REPLY  # every reply runs to max_tokens (end of turn ignored)
    # chunks while every row streamed, from the last first token to the first end (one token a chunk)
    a, b = firsts[-1], ends[0]
    inside = sum(1 for r in replies for t in r if a < t <= b)
    out = {
        "server": label,
        "wall_s": round(wall, 3),
        "aggregate_tps": round(tokens / wall, 1),
        "ttft_p50_s": round(firsts[len(firsts) // 2], 3),
        "last_ttft_s": round(firsts[-1], 3),
        "first_end_s": round(ends[0], 3),
        "last_end_s": round(ends[-1], 3),
        "all_streaming_tps": round(inside / (b - a), 1) if b > a else None,
        "ttfts_s": [round(t, 2) for t in firsts],
    }
    print(
        f"{label}: wall {wall:.2f} s, {out['aggregate_tps']} tok/s, TTFT p50 {out['ttft_p50_s']:.2f} s, "
        f"last first token {a:.2f} s, ends {ends[0]:.2f}-{ends[-1]:.2f} s, all streaming "
        f"{out['all_streaming_tps']} tok/s\n  first tokens: {out['ttfts_s']}",
        flush=True,
    )
    return out


def start(name: str, args: argparse.Namespace, trees: dict[str, Path], logs: Path) -> LaunchedServer:
    ctx = int(64 * 1.25) + REPLY + 256  # bench_peers.py's row for 64-token prompts
    if name == "llama-server":
        gguf = bundled_gguf()
        return start_llama_server(args.llama_server, gguf, parallel=args.streams, ctx=ctx, log_dir=logs)
    env = tree_env(trees[name]) if name in trees else {}
    extra = tuple(args.kinfer_args.split())
    return start_kinfer(
        weights=bundled_gguf(), parallel=args.streams, ctx=ctx, log_dir=logs, extra_args=extra, env=env
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinfer-args", default="")
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR: kinfer from that source tree")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = {name: Path(d).resolve() for name, d in (t.split("=", 1) for t in args.tree)}
    names = ["llama-server", *(trees or ["kinfer"])]
    logs = Path("/tmp/burst-timeline")
    results = []
    for round_ in range(args.rounds):
        for name in names:
            server = start(name, args, trees, logs)
            try:
                asyncio.run(burst(server.target, args.streams, 8, 0))
                wall, replies = asyncio.run(burst(server.target, args.streams, REPLY, 1000 + 100 * round_))
                out = report(f"{name} #{round_ + 1}", wall, replies)
                if name != "llama-server":
                    metrics = httpx.get(server.target.url + "/metrics").text.splitlines()
                    out["pool"] = [line for line in metrics if line.startswith(POOL_METRICS)]
                    print("  " + "; ".join(out["pool"]))
                results.append(out)
            finally:
                server.stop()
    if args.json:
        command = "python " + " ".join(sys.argv)
        args.json.write_text(json.dumps({"command": command, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
