"""Does a long prompt stall the replies that are streaming? Two kinfer source trees side by side.

    .venv/bin/python scripts/bench_stalls.py --tree before=/work/main --tree after=. --threads 1
    .venv/bin/python scripts/bench_stalls.py --tree after=. --prompt-tokens 500 --rounds 1   # a smoke run
    python3 scripts/bench_stalls.py --tree after=. --weights MODEL_DIR --rows 16 --prompt-tokens 50000 \
        --ctx 65536 --threads 0   # the H200 check (an MLX directory, or a GGUF)

For each tree (alternating, ABAB over `--rounds`): start `kinfer --headless` from that tree on the
bundled SmolLM2 (or `--weights`: a GGUF or a model directory), start `--rows` streaming chats (end of
turn ignored), and once each has streamed `--warm-tokens` tokens, send one request with a
`--prompt-tokens` prompt. Reported per run, from the
client's arrival time of each streamed chunk:

- the running rows' largest gap between two chunks from the long prompt's arrival until one second
  after its first token, and their median gap before it arrived;
- the long prompt's TTFT (sent -> first generated text), and its prompt tokens (from usage);
- the load average before and after (the machine may be shared: read the pairs, not the absolutes).

Raw results go to `--json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from kinfer.bench.prompts import PromptSizer, fit_sizer, prompt_text
from kinfer.bench.servers import start_kinfer, tree_env
from kinfer.store.bundled import bundled_gguf

AFTER_FIRST_S = 1.0  # how long the rows are watched after the long prompt's first token
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


class Row(threading.Thread):
    """One streaming chat; `times` holds the arrival of every chunk with text."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.times: list[float] = []
        self.usage: dict = {}
        self.first = threading.Event()
        self.stop = threading.Event()
        self.sent = 0.0
        self.error: str | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=600) as client,
                client.stream("POST", self.url + "/v1/chat/completions", json=self.body) as reply,
            ):
                self.sent = time.monotonic()
                for line in reply.iter_lines():
                    if self.stop.is_set():
                        return
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        self.usage = chunk["usage"]
                    if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                        self.times.append(time.monotonic())
                        self.first.set()
        except Exception as exc:  # reported in the results, the run goes on
            self.error = f"{type(exc).__name__}: {exc}"
            self.first.set()


def chat(model: str | None, messages: list[dict], max_tokens: int) -> dict:
    return {
        "model": model or "",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "ignore_eos": True,
    }


def calibrate(url: str, model: str | None) -> PromptSizer:
    samples = []
    for words in (50, 500):
        body = chat(model, [{"role": "user", "content": prompt_text(words, 1)}], 1) | {"stream": False}
        usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()["usage"]
        samples.append((words, usage["prompt_tokens"]))
    return fit_sizer(samples)


def gap_ends(times: list[float]) -> list[tuple[float, float]]:
    """(gap, when it ended) between consecutive chunks."""
    return [(b - a, b) for a, b in itertools.pairwise(times)]


def one_run(url: str, model: str | None, args: argparse.Namespace, sizer: PromptSizer, seed: int) -> dict:
    rows = [Row(url, chat(model, STORY, args.row_tokens)) for _ in range(args.rows)]
    for row in rows:
        row.start()
    while min(len(row.times) for row in rows) < args.warm_tokens:
        if any(row.error for row in rows):
            raise RuntimeError(f"a row failed: {[row.error for row in rows]}")
        time.sleep(0.01)
    words = sizer.words_for(args.prompt_tokens)
    long = Row(url, chat(model, [{"role": "user", "content": prompt_text(words, seed)}], 4))
    arrived = time.monotonic()
    long.start()
    long.join()
    if long.error or not long.times:
        raise RuntimeError(f"the long prompt failed: {long.error}")
    first = long.times[0]
    time.sleep(AFTER_FIRST_S)
    for row in rows:
        row.stop.set()
    # gaps that end after the prompt was sent (one that spans its arrival counts whole), not before:
    # the rows' own prompts joining before it are not its stall
    window = [
        (g, end - arrived)
        for row in rows
        for g, end in gap_ends(row.times)
        if arrived < end <= first + AFTER_FIRST_S
    ]
    before = [g for row in rows for g, _ in gap_ends([t for t in row.times if t < arrived])]
    largest = max(window)
    return {
        "largest_gap_s": round(largest[0], 3),
        "largest_gap_ends_s": round(largest[1], 3),  # after the long prompt was sent
        "top_gaps_s": [round(g, 3) for g, _ in sorted(window, reverse=True)[:5]],
        "median_gap_s": round(statistics.median(before), 4),
        "ttft_s": round(first - arrived, 3),
        "prompt_tokens": long.usage.get("prompt_tokens"),
        "row_chunks_in_window": len(window),
    }


def check_rows(url: str, model: str | None, needed: int) -> None:
    """Stop unless the loaded model holds a row for every stream and the long prompt: with one fewer
    (a memory budget that holds fewer rows of --ctx than asked) the prompt waits for a row to end, and
    the run measures the queue, not a stall (seen on the H200: qwen3-0.6b at --ctx 40960 held 16)."""
    # the model loads with its first request (a later run reuses the first one's calibration)
    httpx.post(url + "/v1/chat/completions", json=chat(model, STORY, 1) | {"stream": False}, timeout=600)
    metrics = httpx.get(url + "/metrics", timeout=60).text
    found = re.search(r"^kinfer_rows_total\{[^}]*\} ([0-9.]+)$", metrics, re.M)
    if found is None or int(float(found.group(1))) < needed:
        held = str(int(float(found.group(1)))) if found else "unknown"
        raise SystemExit(f"the server holds {held} rows, the run needs {needed}: lower --ctx (see its log)")


def run_tree(label: str, tree: Path, args: argparse.Namespace, sizer: PromptSizer | None, seed: int):
    env = tree_env(tree)  # this tree's kinfer, not the cwd's
    logs = Path(tempfile.mkdtemp(prefix=f"kinfer-stalls-{label}-"))
    extra = ["--step-budget-ms", str(args.step_budget_ms)] if args.step_budget_ms is not None else []
    load_before = os.getloadavg()
    with start_kinfer(
        weights=args.weights or bundled_gguf(),
        parallel=args.rows + 1,
        ctx=args.ctx,
        threads=args.threads,
        log_dir=logs,
        env=env,
        extra_args=extra if label != "before" else [],
        label=label,
    ) as server:
        url, model = server.target.url, server.target.model
        sizer = sizer or calibrate(url, model)
        check_rows(url, model, args.rows + 1)
        result = one_run(url, model, args, sizer, seed)
    result.update(tree=label, path=str(tree), load_before=load_before, load_after=os.getloadavg())
    return result, sizer


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", default=[], help="label=path of a kinfer source tree")
    parser.add_argument("--weights", type=Path, help="a GGUF or model directory (default: bundled SmolLM2)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--row-tokens", type=int, default=3000, help="max_tokens of each streaming row")
    parser.add_argument("--warm-tokens", type=int, default=20)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--step-budget-ms", type=float, default=None, help="passed to trees other than 'before'"
    )
    parser.add_argument("--json", type=Path, default=Path("docs/benchmarks/stalls.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    trees = [(label, Path(path).resolve()) for label, path in (t.split("=", 1) for t in args.tree)]
    if not trees:
        parser.error("give at least one --tree label=path")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs, sizer = [], None
    for round_ in range(args.rounds):
        for label, tree in trees:
            result, sizer = run_tree(label, tree, args, sizer, seed=100 + round_)
            print(json.dumps(result), flush=True)
            runs.append(result)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k not in ("tree", "json")
        },
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("| run | tree | largest gap (s) | median gap (s) | TTFT (s) | prompt tokens | load avg |")
    print("|---|---|---:|---:|---:|---:|---|")
    for i, run in enumerate(runs, 1):
        load = f"{run['load_before'][0]:.1f} -> {run['load_after'][0]:.1f}"
        print(
            f"| {i} | {run['tree']} | {run['largest_gap_s']} | {run['median_gap_s']} | {run['ttft_s']} "
            f"| {run['prompt_tokens']} | {load} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
