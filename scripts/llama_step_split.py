"""Where a decode step of kinfer's llama.cpp engine goes: inside `llama_decode`, or in the engine's own
Python around it (batch building, sampling, bookkeeping).

    .venv/bin/python scripts/llama_step_split.py                  # bundled SmolLM2, 16 rows, auto threads
    .venv/bin/python scripts/llama_step_split.py --rows 8 --threads 2 --gguf MODEL.gguf
    .venv/bin/python scripts/llama_step_split.py --flash-attn on     # llama.cpp's flash attention
    .venv/bin/python scripts/llama_step_split.py --rows 1 --prompt-tokens 4000   # one long row

Drives the engine directly (no server): `--rows` greedy replies of one prompt each, then times
`--steps` steps once every row is generating. If a step is slower than llama-server's at the same
rows while the time outside `llama_decode` is small, the gap is in llama.cpp's own work.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kinfer.config import parse_switch
from kinfer.engines.base import GenerationJob
from kinfer.engines.llama import engine as llama_engine
from kinfer.engines.llama import native
from kinfer.protocol import Sampling
from kinfer.store.bundled import bundled_gguf

PROMPT = "Tell me a long story about a lighthouse keeper and the sea."


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", type=Path, default=None, help="default: the bundled SmolLM2")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="0: automatic (the thread tuner)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--prompt-tokens", type=int, default=0, help="each row's prompt this long (0: a one-line prompt)"
    )
    parser.add_argument("--no-prefix-cache", action="store_true", help="no pooled prompts (no KV streams)")
    parser.add_argument(
        "--flash-attn", choices=("auto", "on", "off"), default="auto", help="as kinfer's --flash-attn"
    )
    args = parser.parse_args()
    gguf = args.gguf or bundled_gguf()
    if gguf is None:
        raise SystemExit("no GGUF: pass --gguf")
    engine = llama_engine.LlamaEngine(
        gguf,
        name="split",
        rows=args.rows,
        ctx=args.steps + max(args.prompt_tokens, 250) + 50,
        threads=args.threads,
        prefix_cache=not args.no_prefix_cache,
        flash_attn=parse_switch(args.flash_attn, auto=True),
    )
    inside = [0.0]
    decode = native.decode

    def timed_decode(ctx, batch):
        began = time.perf_counter()
        try:
            return decode(ctx, batch)
        finally:
            inside[0] += time.perf_counter() - began

    llama_engine.native.decode = timed_decode
    prompt = tuple(engine.tokenize(PROMPT))
    if args.prompt_tokens:  # the line over and over, cut to length (less the row's own last token)
        repeated = " ".join([PROMPT] * (args.prompt_tokens // 8 + 1))
        prompt = tuple(engine.tokenize(repeated))[: args.prompt_tokens - 1]
    prefill_began = time.perf_counter()
    for i in range(args.rows):  # a different last token per row: no prefix shared, every row its own prompt
        job = GenerationJob(
            f"r{i}", (*prompt, i), Sampling(temperature=0.0), max_tokens=args.steps + 50, ignore_eos=True
        )
        engine.submit(job)
    started: set[str] = set()
    while engine.has_work and len(started) < args.rows:
        started |= {u.job_id for u in engine.step() if u.new_tokens}
    prefill = time.perf_counter() - prefill_began
    for _ in range(5):  # every row generating: a few steps to settle
        engine.step()
    inside[0] = 0.0
    began = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    wall = (time.perf_counter() - began) * 1e3 / args.steps
    spent = inside[0] * 1e3 / args.steps
    outside = wall - spent
    head = f"{args.rows} rows, {engine.plan.n_seq} KV streams, flash attention {args.flash_attn}"
    prompts = f", prompts {args.rows * (len(prompt) + 1) / prefill:.0f} tok/s" if args.prompt_tokens else ""
    print(f"{head}: {wall:.2f} ms a step, llama_decode {spent:.2f} ms, outside it {outside:.2f} ms{prompts}")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
