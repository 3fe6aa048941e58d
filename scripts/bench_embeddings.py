"""Embedding throughput: kinfer against llama-server on the same embedding GGUF, inputs per second.

    python scripts/bench_embeddings.py --gguf nomic-embed-text-v1.5.Q8_0.gguf \\
        --llama-server /path/to/llama-server --out bench-embeddings.json
    python scripts/bench_embeddings.py --gguf tiny.gguf --inputs 32        # kinfer alone, a smoke run

Both servers get the same work over OpenAI's POST /v1/embeddings: `--inputs` texts of at most
`--tokens` tokens each as the GGUF's tokenizer counts them (deterministic word salad), split into
`--concurrency` requests sent at once. Each server is started once and warmed up; then the rounds
alternate A B A B (`--rounds` pairs) so drift of the machine (heat, other load) falls on both.
llama-server runs with `--embeddings`, one slot per concurrent request. The JSON report has every
round's wall time and inputs/s, the CPU time each server process spent (inputs per CPU-second: the
fairer figure when other jobs share the machine), the means per server, and the cosine agreement of
the two servers' vectors for the same inputs. Run it on a quiet machine where you can.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from kinfer.bench.servers import LaunchedServer, start_kinfer, start_llama_server
from kinfer.engines.llama.sizing import available_threads

WORDS = (
    "the",
    "river",
    "city",
    "morning",
    "light",
    "quiet",
    "market",
    "bread",
    "stone",
    "window",
    "garden",
    "music",
    "letter",
    "train",
    "station",
    "summer",
    "winter",
    "mountain",
    "ocean",
    "forest",
    "library",
    "coffee",
    "history",
    "science",
    "number",
    "question",
    "answer",
    "paper",
    "engine",
    "memory",
    "signal",
    "network",
    "model",
    "vector",
    "search",
    "document",
    "query",
    "distance",
    "meaning",
    "language",
)
REQUEST_TIMEOUT_S = 600.0


def make_inputs(count: int, tokens: int, count_tokens: Callable[[str], int], seed: int = 0) -> list[str]:
    """`count` distinct texts of `tokens` tokens or a few fewer, as the model's own tokenizer counts
    them (special tokens included): words are added while the text still fits, so a vocabulary
    that spells words letter by letter gets fewer words, not longer inputs."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(count):
        text = f"{i}:"
        for word in rng.choice(WORDS, size=tokens):
            longer = f"{text} {word}"
            if count_tokens(longer) > tokens:
                break
            text = longer
        texts.append(text)
    return texts


def gguf_token_counter(gguf: Path) -> Callable[[str], int]:
    """Counts a text's tokens as both servers tokenize an embedding input (with [CLS] / [SEP] or BOS)."""
    from llama_cpp import Llama

    vocab = Llama(str(gguf), vocab_only=True, verbose=False)
    return lambda text: len(vocab.tokenize(text.encode("utf-8"), add_bos=True, special=True))


def chunks(items: list[str], parts: int) -> list[list[str]]:
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)]


async def run_round(url: str, model: str | None, batches: list[list[str]]) -> tuple[float, int, list]:
    """Send every batch at once; (seconds, prompt tokens, vectors in input order)."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:

        async def one(batch: list[str]) -> dict[str, Any]:
            body: dict[str, Any] = {"input": batch, "encoding_format": "float"}
            if model:
                body["model"] = model
            reply = await client.post(url + "/v1/embeddings", json=body)
            if reply.status_code != 200:
                raise RuntimeError(f"{url} answered {reply.status_code}: {reply.text[:500]}")
            return reply.json()

        started = time.perf_counter()
        replies = await asyncio.gather(*(one(b) for b in batches))
        seconds = time.perf_counter() - started
    tokens = sum(int(r.get("usage", {}).get("prompt_tokens", 0)) for r in replies)
    vectors = [d["embedding"] for r in replies for d in sorted(r["data"], key=lambda d: d["index"])]
    return seconds, tokens, vectors


def start_embedding_llama_server(
    binary: Path, gguf: Path, args: argparse.Namespace, logs: Path
) -> LaunchedServer:
    """llama-server with `--embeddings`, one slot per concurrent request."""
    return start_llama_server(
        binary,
        gguf,
        parallel=args.concurrency,
        ctx=max(512, args.tokens * 4),
        threads=args.threads,
        log_dir=logs,
        extra_args=["--embeddings", *args.llama_server_args],
    )


def start_servers(args: argparse.Namespace, logs: Path) -> dict[str, tuple[LaunchedServer, str | None]]:
    servers: dict[str, tuple[LaunchedServer, str | None]] = {}
    kinfer = start_kinfer(weights=args.gguf, threads=args.threads, label="kinfer", log_dir=logs)
    servers["kinfer"] = (kinfer, kinfer.target.model)
    if args.llama_server:
        servers["llama-server"] = (
            start_embedding_llama_server(args.llama_server, args.gguf, args, logs),
            None,
        )
    return servers


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of the server process, all its threads: on a machine other jobs share,
    inputs per CPU-second compare the servers' work where wall time also measures the neighbours."""
    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def agreement(a: list, b: list) -> dict[str, float]:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", type=Path, required=True, help="an embedding GGUF (both servers load it)")
    parser.add_argument(
        "--llama-server", type=Path, help="path to a llama-server binary (omit: kinfer alone)"
    )
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64, help="at most this many tokens per input")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (the inputs split)")
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs after the warm-up")
    parser.add_argument("--threads", type=int, default=available_threads())
    parser.add_argument("--out", type=Path, help="write the JSON report here (default: stdout)")
    parser.add_argument(
        "--llama-server-args", nargs=argparse.REMAINDER, default=[], help="passed to llama-server as they are"
    )
    args = parser.parse_args(argv)
    inputs = make_inputs(args.inputs, args.tokens, gguf_token_counter(args.gguf))
    batches = chunks(inputs, args.concurrency)
    logs = Path(tempfile.mkdtemp(prefix="kinfer-bench-embed-"))
    servers = start_servers(args, logs)
    rounds: list[dict[str, Any]] = []
    vectors: dict[str, list] = {}
    try:
        for server, model in servers.values():  # warm-up: load, first passes, allocations
            asyncio.run(
                run_round(server.target.url, model, chunks(inputs[: args.concurrency], args.concurrency))
            )
        for n in range(args.rounds):
            for name, (server, model) in servers.items():  # A B, A B, ...
                load = os.getloadavg()[0]  # the machine's load as the round starts (others' jobs too)
                cpu = cpu_seconds(server.pid)
                seconds, tokens, got = asyncio.run(run_round(server.target.url, model, batches))
                cpu = cpu_seconds(server.pid) - cpu
                vectors.setdefault(name, got)
                rounds.append(
                    {
                        "round": n,
                        "server": name,
                        "seconds": round(seconds, 4),
                        "inputs": len(got),
                        "prompt_tokens": tokens,
                        "inputs_per_second": round(len(got) / seconds, 2),
                        "server_cpu_seconds": round(cpu, 2),
                        "inputs_per_cpu_second": round(len(got) / cpu, 2) if cpu > 0 else None,
                        "load_1m": round(load, 2),
                    }
                )
                print(f"round {n} {name}: {len(got) / seconds:.1f} inputs/s", file=sys.stderr, flush=True)
    finally:
        for server, _ in servers.values():
            server.stop()
    summary = {
        name: {
            "mean_inputs_per_second": round(
                statistics.mean(r["inputs_per_second"] for r in rounds if r["server"] == name), 2
            ),
            "mean_inputs_per_cpu_second": round(
                statistics.mean(r["inputs_per_cpu_second"] or 0 for r in rounds if r["server"] == name),
                2,
            ),
            "tokens_per_input": round(
                statistics.mean(r["prompt_tokens"] for r in rounds if r["server"] == name) / args.inputs, 1
            ),
        }
        for name in servers
    }
    report: dict[str, Any] = {
        "gguf": str(args.gguf),
        "inputs": args.inputs,
        "tokens_per_input_target": args.tokens,
        "concurrency": args.concurrency,
        "threads": args.threads,
        "order": [r["server"] for r in rounds],
        "rounds": rounds,
        "summary": summary,
    }
    if "kinfer" in vectors and "llama-server" in vectors:
        report["agreement"] = agreement(vectors["kinfer"], vectors["llama-server"])
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
