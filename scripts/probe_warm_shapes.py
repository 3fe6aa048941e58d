"""Which prompt attention shapes serving meets that the warm-up never ran (MLX, any machine).

    python scripts/probe_warm_shapes.py MODEL_DIR [--ctx 6000] [--prompt-words 300] [--json out.json]

On CUDA a pass shape seen for the first time costs the host new CUDA graphs (and cuBLASLt its
choice of kernels), which is why the engine runs at load the shapes serving meets first (warm_up.py).
This builds an engine with CUDA's shape buckets forced on (on a CPU too: the shapes are the same),
records every attention call's (rows, queries, keys) during the warm-up, then serves what a server
beside an agent sees: a short request whose prompt goes to the prefix pool, two rows streaming, and a
longer prompt arriving beside them (its chat preamble adopted from the pool, so its first chunk starts
past position 0), under CUDA's fixed share beside decoding rows. Printed: the shapes serving met that
the warm-up never ran. A new shape is not always a new CUDA graph: MLX keys its graphs by topology and
updates one in place for new sizes; on the H200 the chunks past position 0 met new graphs at their first
such chunk only (its explicit mask), until the warm-up ran every length one position in
(docs/benchmarks.md, "H200, 2026-12-05"). `profile_steps.py --kernels-per-step` names the graphs
themselves, on a GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kinfer.engines.base import GenerationJob  # kinfer first: it picks MLX's BLAS on a CPU
from kinfer.engines.mlx import sdpa_buckets, shape_buckets
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.protocol import Sampling

Shape = tuple[int, int, int]  # rows, queries, keys (padded to the bucket)


def chat(user: str) -> str:
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


def run(engine: MlxEngine, jobs: list[GenerationJob], arrive: dict[int, GenerationJob]) -> None:
    for job in jobs:
        engine.submit(job)
    step = 0
    while engine.has_work or arrive:
        engine.step()
        step += 1
        if step in arrive:
            engine.submit(arrive.pop(step))


def probe(model: Path, ctx: int, words: int) -> dict:
    shape_buckets.set_enabled(True)
    seen: dict[str, set[Shape]] = {"warm-up": set(), "serving": set()}
    phase = ["warm-up"]
    real = sdpa_buckets._sdpa

    def recording(q, k, v, scale, mask, sinks):
        seen[phase[0]].add((q.shape[0], q.shape[2], k.shape[2]))
        return real(q, k, v, scale, mask, sinks)

    sdpa_buckets._sdpa = recording
    try:
        # CUDA's chunk cap (a CPU's is 128), so a long prompt beside decoding rows takes CUDA's share
        engine = MlxEngine(model, name=model.name, rows=4, ctx=ctx, prefill_chunk=2048)
        phase[0] = "serving"
        engine._clock.budget.timed = False  # CUDA's fixed share beside decoding rows

        def job(job_id: str, text: str, tokens: int) -> GenerationJob:
            prompt = tuple(engine.tokenize(chat(text)))
            return GenerationJob(job_id, prompt, Sampling(temperature=0.0), tokens, ignore_eos=True)

        run(engine, [job("first", "hello", 4)], {})  # its prompt goes to the prefix pool
        long = job("long", " ".join(f"item {i}," for i in range(words)), 4)
        streaming = [job(f"s{i}", f"question {i}", 60) for i in range(2)]
        run(engine, streaming, {3: long})
        engine.close()
    finally:
        sdpa_buckets._sdpa = real
        shape_buckets.set_enabled(None)
    new = sorted(seen["serving"] - seen["warm-up"])
    return {
        "long_prompt_tokens": len(long.prompt),
        "warm_up_shapes": len(seen["warm-up"]),
        "serving_shapes": len(seen["serving"]),
        "new": [list(s) for s in new],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path)
    parser.add_argument("--ctx", type=int, default=6000)
    parser.add_argument("--prompt-words", type=int, default=300, help="the long prompt: 'item N,' words")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = probe(args.model, args.ctx, args.prompt_words)
    print(
        f"long prompt {result['long_prompt_tokens']} tokens; attention shapes: warm-up "
        f"{result['warm_up_shapes']}, serving {result['serving_shapes']}, new in serving {len(result['new'])}"
    )
    for rows, queries, keys in result["new"]:
        print(f"  rows {rows}, queries {queries}, keys {keys}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
