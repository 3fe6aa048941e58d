"""Benchmark the llama.cpp engine driven directly (no server, no scheduler).

    .venv/bin/python scripts/bench_llama_engine.py                # bundled SmolLM2, prints markdown
    .venv/bin/python scripts/bench_llama_engine.py --write-docs   # also updates docs/benchmarks.md

1. Aggregate decode speed at 1/4/8/16 rows: each row a different ~64-token prompt, 128 tokens each,
   end-of-generation ignored. Decode time runs from the step after the last prompt was prefilled.
2. Prefix pool: a >= 2,000-token system prompt; time to first token of a cold first turn vs a second
   turn that shares the system prompt (adopted from the pool), and their ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kinfer.engines.base import GenerationJob
from kinfer.engines.llama.engine import LlamaEngine
from kinfer.protocol import Sampling
from kinfer.store.bundled import bundled_gguf

SECTION = "## llama.cpp engine, driven directly (this machine)"
GREEDY = Sampling(temperature=0.0)
TOPICS = [
    "the water cycle", "medieval castles", "how bees make honey", "the first moon landing",
    "volcanoes", "the printing press", "deep sea creatures", "the Roman roads", "paper making",
    "glaciers", "the steam engine", "coral reefs", "the silk road", "desert plants", "comets",
    "lighthouses",
]  # fmt: skip


@dataclass(frozen=True)
class DecodeRun:
    rows: int
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    generated: int

    @property
    def tok_s(self) -> float:
        return self.generated / self.decode_s


def chat(engine: LlamaEngine, user: str, system: str | None = None) -> tuple[int, ...]:
    text = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    text += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(engine.tokenize(text))


def prompt_of(engine: LlamaEngine, topic: str, target: int) -> tuple[int, ...]:
    """A chat prompt about `topic`, padded with plain sentences to about `target` tokens."""
    words = f"Please write a short, friendly explanation of {topic} for a curious reader."
    prompt = chat(engine, words)
    while len(prompt) < target:
        words += f" Mention one more fact about {topic}."
        prompt = chat(engine, words)
    return prompt


def bench_decode(model: Path, rows: int, prompt_tokens: int, new_tokens: int, threads: int) -> DecodeRun:
    with LlamaEngine(model, name="bench", rows=rows, ctx=512, threads=threads, prefix_cache=False) as engine:
        prompts = [prompt_of(engine, TOPICS[i % len(TOPICS)], prompt_tokens) for i in range(rows)]
        for i, prompt in enumerate(prompts):
            engine.submit(GenerationJob(f"r{i}", prompt, GREEDY, new_tokens, ignore_eos=True))
        t0 = time.perf_counter()
        generated = 0
        while engine.stats().prompt_tokens_total < sum(map(len, prompts)):
            generated += sum(u.new_tokens for u in engine.step())
        t1 = time.perf_counter()
        first = generated
        while engine.has_work:
            generated += sum(u.new_tokens for u in engine.step())
        t2 = time.perf_counter()
    return DecodeRun(rows, sum(map(len, prompts)) // rows, t1 - t0, t2 - t1, generated - first)


def system_prompt(min_tokens: int, engine: LlamaEngine) -> str:
    """A long, varied system prompt (a bakery's house rules) of at least `min_tokens` tokens."""
    rules = [
        f"Rule {i}: when a customer asks about {TOPICS[i % len(TOPICS)]}, answer in at most "
        f"{2 + i % 5} sentences, stay polite, and mention that the bakery opens at {6 + i % 3} o'clock."
        for i in range(400)
    ]
    text = "You are the assistant of a bakery. Follow these house rules.\n"
    for rule in rules:
        text += rule + "\n"
        if len(engine.tokenize(text)) >= min_tokens:
            return text
    return text


def time_to_first_token(engine: LlamaEngine, job: GenerationJob) -> tuple[float, int]:
    engine.submit(job)
    t0 = time.perf_counter()
    ttft, reused = None, 0
    while engine.has_work:
        for update in engine.step():
            reused = update.reused_tokens
            if ttft is None and (update.new_tokens or update.finish):
                ttft = time.perf_counter() - t0
    assert ttft is not None
    return ttft, reused


def bench_prefix(model: Path, system_tokens: int, threads: int) -> dict[str, float]:
    with LlamaEngine(model, name="bench", rows=2, ctx=4096, threads=threads) as engine:
        system = system_prompt(system_tokens, engine)
        first = chat(engine, "When do you open on Sunday?", system)
        second = chat(engine, "Do you sell rye bread?", system)
        cold, _ = time_to_first_token(engine, GenerationJob("t1", first, GREEDY, 8))
        warm, reused = time_to_first_token(engine, GenerationJob("t2", second, GREEDY, 8))
        stats = engine.stats()
        system_len = len(engine.tokenize(system))
    return {
        "system": system_len,
        "first": len(first),
        "second": len(second),
        "cold": cold,
        "warm": warm,
        "reused": reused,
        "hits": stats.prefix_hits,
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {cores} cores available, {platform.system()} {platform.release()}, load avg {load:.1f}"


def render(decode: list[DecodeRun], prefix: dict[str, float], args: argparse.Namespace, where: str) -> str:
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python scripts/bench_llama_engine.py {' '.join(args.argv)}`".rstrip() + "  ",
        f"Machine: {where}  ",
        f"Model: `{args.model.name}`, llama-cpp-python (CPU build, NATIVE=OFF), threads "
        f"{args.threads or 'automatic'}, greedy, one run each.",
        "",
        f"Decode: each row a different ~{args.prompt_tokens}-token prompt, {args.tokens} tokens each, "
        "end-of-generation ignored; decode time starts once every prompt is prefilled.",
        "",
        "| rows | prompt tok/row | prefill s | decode s | generated | aggregate tok/s | per row tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in decode:
        lines.append(
            f"| {run.rows} | {run.prompt_tokens} | {run.prefill_s:.2f} | {run.decode_s:.2f} | "
            f"{run.generated} | {run.tok_s:.1f} | {run.tok_s / run.rows:.1f} |"
        )
    ratio = prefix["cold"] / prefix["warm"]
    lines += [
        "",
        f"Prefix pool: a {prefix['system']:.0f}-token system prompt; turn 1 cold, turn 2 (a different "
        "question after the same system prompt) adopts it from the pool.",
        "",
        "| turn | prompt tokens | reused from pool | time to first token s |",
        "|---|---:|---:|---:|",
        f"| 1 (cold) | {prefix['first']:.0f} | 0 | {prefix['cold']:.2f} |",
        f"| 2 (warm) | {prefix['second']:.0f} | {prefix['reused']:.0f} | {prefix['warm']:.3f} |",
        "",
        f"Time to first token, cold / warm: **{ratio:.0f}x** (target >= 10x).",
        "",
    ]
    return "\n".join(lines)


def write_docs(section: str) -> Path:
    """Replace this script's section of docs/benchmarks.md (other sections are left alone)."""
    path = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: bundled SmolLM2)")
    parser.add_argument("--rows", default="1,4,8,16", help="row counts to measure, comma separated")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per row")
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all available)")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.model is None:
        args.model = bundled_gguf()
        if args.model is None:
            parser.error("no bundled model: run scripts/setup.sh, or pass --model")
    decode = []
    for rows in (int(r) for r in args.rows.split(",")):
        run = bench_decode(args.model, rows, args.prompt_tokens, args.tokens, args.threads)
        print(f"rows {rows}: {run.tok_s:.1f} tok/s aggregate", file=sys.stderr)
        decode.append(run)
    prefix = bench_prefix(args.model, args.system_tokens, args.threads)
    print(f"prefix: cold {prefix['cold']:.2f}s warm {prefix['warm']:.3f}s", file=sys.stderr)
    section = render(decode, prefix, args, machine())
    print(section)
    if args.write_docs:
        print(f"wrote {write_docs(section)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
