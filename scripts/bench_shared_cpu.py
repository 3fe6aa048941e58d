"""Does kinfer's llama.cpp decode survive a shared CPU? Quiet vs busy, for OpenMP wait policies and
the decode thread tuner.

    .venv/bin/python scripts/bench_shared_cpu.py --policy default --policy ACTIVE --rounds 2
    .venv/bin/python scripts/bench_shared_cpu.py --policy tuned --policy fixed --rounds 2 --after

For each policy (alternating, ABAB over `--rounds`): start `kinfer --headless` on the bundled SmolLM2
with that OpenMP wait policy in its environment (`default`: what kinfer sets by itself; `ACTIVE` /
`PASSIVE`: `OMP_WAIT_POLICY`; `spin=N`: `GOMP_SPINCOUNT=N`) and `--threads` (0, the default, leaves the
thread tuner on), or with kinfer's own wait and a thread policy (`tuned`: `--threads 0`, decode steps on
the count the tuner picks; `fixed`: `--threads` = every core, the tuner off: what kinfer did before it;
`threads=N`: `--threads N`; `flash-attn-off`: the default with the batch-invariant CPU flash
attention switched off, as kinfer ran before it), then at each of `--rows` concurrent streaming chats
(end of turn ignored) measure the aggregate decode tok/s, first on a quiet machine, then with one busy
competing process per core (a Python loop the benchmark starts and stops). Decode tok/s: the tokens
streamed after each reply's first one, over the time from the first of those first tokens to the last
reply's end.

Read the busy / quiet ratio per policy (goal: >= 50 % at 1 and 4 rows) and each policy's quiet speed
against the others' (goal: within 10 % of the best). Each measurement also records the decode thread
count the server showed after it (`kinfer_engine_threads`); `--after` measures once more, quiet, after
the burners stop (the tuner should be back on every thread within a second of decoding). Raw results
go to `--json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from kinfer.bench.report import machine_info
from kinfer.bench.servers import start_kinfer
from kinfer.store.bundled import bundled_gguf

PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
SETTLE_S = 1.0  # burners run this long before the measurement starts


def burn() -> None:
    while True:
        pass


class Burners:
    """One busy process per core while the block runs."""

    def __enter__(self) -> Burners:
        self.procs = [multiprocessing.Process(target=burn, daemon=True) for _ in range(os.cpu_count() or 1)]
        for proc in self.procs:
            proc.start()
        time.sleep(SETTLE_S)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.join()


def stream_one(url: str, model: str | None, tokens: int, times: list[float]) -> None:
    body = {
        "model": model or "",
        "messages": PROMPT,
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    with (
        httpx.Client(timeout=900) as client,
        client.stream("POST", url + "/v1/chat/completions", json=body) as reply,
    ):
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                times.append(time.monotonic())


def decode_rate(url: str, model: str | None, rows: int, tokens: int) -> dict:
    """Aggregate decode tok/s of `rows` concurrent replies (chunks after each reply's first)."""
    times: list[list[float]] = [[] for _ in range(rows)]
    threads = [threading.Thread(target=stream_one, args=(url, model, tokens, t)) for t in times]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(len(t) < 2 for t in times):
        raise RuntimeError("a reply streamed fewer than two chunks")
    start = min(t[0] for t in times)
    end = max(t[-1] for t in times)
    chunks = sum(len(t) - 1 for t in times)
    return {
        "rows": rows,
        "chunks": chunks,
        "seconds": round(end - start, 3),
        "tok_s": round(chunks / (end - start), 2),
    }


def threads_shown(url: str) -> float | None:
    """The decode thread count the server's /metrics shows (None: no llama.cpp model on a CPU)."""
    found = re.search(r"^kinfer_engine_threads\{[^}]*\} ([\d.]+)$", httpx.get(url + "/metrics").text, re.M)
    return float(found[1]) if found else None


def measured(url: str, model: str | None, rows: int, tokens: int) -> dict:
    return decode_rate(url, model, rows, tokens) | {"threads_after": threads_shown(url)}


def policy_threads(policy: str, args: argparse.Namespace) -> int:
    if policy == "tuned":
        return 0
    if policy == "fixed":
        return args.threads or len(os.sched_getaffinity(0))
    if policy.startswith("threads="):  # a fixed count, more than the cores included
        return int(policy.removeprefix("threads="))
    return args.threads


def policy_env(policy: str) -> dict[str, str]:
    if policy in ("default", "tuned", "fixed") or policy.startswith("threads="):
        return {}
    if policy.startswith("spin="):
        return {"GOMP_SPINCOUNT": policy.removeprefix("spin=")}
    if policy == "flash-attn-off":  # the batch-invariant CPU flash attention off: auto leaves it off
        return {"GGML_CPU_FA_BATCH_INVARIANT": "0"}
    return {"OMP_WAIT_POLICY": policy}


def run_policy(policy: str, args: argparse.Namespace) -> list[dict]:
    logs = Path(tempfile.mkdtemp(prefix="kinfer-shared-cpu-"))
    env = policy_env(policy)
    results = []
    with start_kinfer(
        weights=bundled_gguf(),
        parallel=max(args.rows),
        ctx=2048,
        threads=policy_threads(policy, args),
        log_dir=logs,
        env=env,
        label=policy,
    ) as server:
        url, model = server.target.url, server.target.model
        decode_rate(url, model, 1, 8)  # warm-up
        for rows in args.rows:
            quiet = measured(url, model, rows, args.tokens)
            with Burners():
                busy = measured(url, model, rows, args.tokens)
            ratio = round(busy["tok_s"] / quiet["tok_s"], 3)
            result = {
                "policy": policy,
                "env": env,
                "threads": policy_threads(policy, args),
                "rows": rows,
                "quiet": quiet,
                "busy": busy,
                "busy_over_quiet": ratio,
            }
            if args.after:
                result["after"] = measured(url, model, rows, args.tokens)
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help="default, ACTIVE, PASSIVE, spin=N, tuned, fixed, threads=N",
    )
    parser.add_argument("--rows", default="1,4", help="comma separated concurrent replies")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each reply")
    parser.add_argument("--threads", type=int, default=0, help="kinfer --threads (0: its default)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--after", action="store_true", help="measure quiet again after the burners stop")
    parser.add_argument("--json", type=Path, default=Path("docs/benchmarks/shared-cpu.json"))
    args = parser.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    policies = args.policy or ["default", "ACTIVE"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs = []
    for _ in range(args.rounds):
        for policy in policies:
            runs.extend(run_policy(policy, args))
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {"rows": args.rows, "tokens": args.tokens, "threads": args.threads, "after": args.after},
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("| policy | rows | quiet tok/s | busy tok/s | busy / quiet | threads quiet / busy | after tok/s |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for run in runs:
        after = run.get("after")
        shown = f"{run['quiet']['threads_after']} / {run['busy']['threads_after']}"
        print(
            f"| {run['policy']} | {run['rows']} | {run['quiet']['tok_s']} | {run['busy']['tok_s']} "
            f"| {run['busy_over_quiet']:.0%} | {shown} | {after['tok_s'] if after else '-'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
