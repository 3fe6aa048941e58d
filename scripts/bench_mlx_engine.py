"""Aggregate decode speed of kinfer's MLX engine vs mlx-lm's BatchGenerator, on the same random weights.

    python scripts/bench_mlx_engine.py            # qwen3-0.6b and qwen3.5-0.8b shapes, 1/4/16/64 rows
    python scripts/bench_mlx_engine.py --tiny     # seconds on a CPU: a smoke test of the script
    python scripts/bench_mlx_engine.py --sizes qwen3-0.6b --rows 64 --tokens 256 --json out.json
    python scripts/bench_mlx_engine.py --engines kinfer --rows 1,64,256 --breakdown   # where a step goes
    python scripts/bench_mlx_engine.py --tiny --layers 28 --engines kinfer --rows 1,8 --ops   # primitives

Random bf16 weights in the real models' shapes (tok/s does not depend on the values), a word-level
tokenizer over the whole vocabulary, 128-token prompts (different per row), 256 tokens per reply with
EOS ignored. Decode tok/s counts the tokens generated once every row is generating, over that window;
"all started" is the time from submitting the prompts to every row's first token (the batch's
prefill). Peak memory is MLX's peak for the run.

--breakdown (kinfer only) adds the mean host milliseconds per decode step over the same window, by
phase (kinfer/engines/mlx/step_timer.py): build (Python building the lazy graph), launch (inside
mx.async_eval: MLX encoding and launching it), wait (the host waiting on the device for the previous
step's tokens), other (bookkeeping, stop checks, detokenizing); they add up to the step's total. On
CUDA it adds `gpu`: the device's busy ms per decode step (kernels, copies and memsets, overlaps once),
recorded through CUPTI over 32 decode steps in a run apart (scripts/kernel_times.py; needs torch, which
the H200 machine has): the step is host-bound where `gpu` is under `total`.
--ops (kinfer only) counts the primitives of one decode step's graph in a short run apart
(kinfer/engines/mlx/graph_ops.py; "per layer" is the step's count over the layers). --compiled-step
on|off and --fuse-projections auto|on|off set those engine switches (the mlx_compiled_step and
mlx_fuse_projections settings); --layers N gives the shapes N decoder layers (a tiny model as deep as
a real one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile
import time
from pathlib import Path

from kinfer.engines.mlx import blas  # noqa: F401  (before the first `import mlx`)

# isort: split

import mlx.core as mx

from kinfer.config import parse_switch
from kinfer.engines.mlx.memory import PeakWindow

SHAPES = {
    # numbers from the models' config.json
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "qwen3.5-0.8b": {
        "model_type": "qwen3_5",
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "intermediate_size": 3584,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "rms_norm_eps": 1e-6,
            "vocab_size": 248320,
            "max_position_embeddings": 262144,
            "full_attention_interval": 4,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
            },
        },
    },
}
TINY = {
    "qwen3-0.6b": {
        **SHAPES["qwen3-0.6b"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
    },
    "qwen3.5-0.8b": {
        **SHAPES["qwen3.5-0.8b"],
        "text_config": {
            **SHAPES["qwen3.5-0.8b"]["text_config"],
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 512,
            "full_attention_interval": 2,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
    },
}


def with_layers(config: dict, layers: int) -> dict:
    """`config` with `layers` decoder layers (a tiny model as deep as a real one: per-layer costs)."""
    if "text_config" in config:
        return {**config, "text_config": {**config["text_config"], "num_hidden_layers": layers}}
    return {**config, "num_hidden_layers": layers}


def build_model_dir(out: Path, config: dict, dtype: str) -> Path:
    """Random weights in `config`'s shape saved as a Hugging Face directory with a word-level tokenizer."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    target = getattr(mx, dtype)
    weights = {
        k: (v if k.endswith("A_log") else v.astype(target)) for k, v in tree_flatten(model.parameters())
    }
    mx.eval(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    del model, weights
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}))
    vocab = config.get("text_config", config)["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


def make_prompts(rows: int, length: int, vocab: int, seed: int = 1) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(rows)]


def bench_kinfer(
    path: Path,
    prompts: list[list[int]],
    tokens: int,
    breakdown: bool = False,
    precompiled: bool = False,
    compiled_step: bool = True,
    ops: bool = False,
    fuse_projections: bool | None = None,
    device_time: bool = True,
) -> dict:
    from kinfer.engines.base import GenerationJob
    from kinfer.engines.mlx.engine import MlxEngine
    from kinfer.engines.mlx.graph_ops import OpCounter
    from kinfer.engines.mlx.step_timer import NO_TIMER, StepTimer
    from kinfer.protocol import Sampling

    rows = len(prompts)
    ctx = len(prompts[0]) + tokens + 8
    engine = MlxEngine(
        path,
        name="bench",
        rows=rows,
        ctx=ctx,
        prefix_cache=False,
        prefill_chunk=2048,
        precompiled_kernels=precompiled,
        compiled_step=compiled_step,
        fuse_projections=fuse_projections,
    )
    timer = StepTimer()
    layers = len(engine._layers)

    def run(max_tokens: int, meter=timer) -> tuple[float, int, float]:
        submitted = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.submit(
                GenerationJob(
                    f"r{i}", tuple(p), Sampling(temperature=0.0), max_tokens=max_tokens, ignore_eos=True
                )
            )
        started: set[str] = set()
        t0, counted = None, 0
        while engine.has_work:
            for u in engine.step():
                if u.new_tokens:
                    if t0 is not None:
                        counted += u.new_tokens
                    started.add(u.job_id)
            if t0 is None and len(started) == rows:
                t0 = time.perf_counter()
                meter.clear()  # the breakdown covers the decode window only
        end = time.perf_counter()
        return end - (t0 or end), counted, (t0 or end) - submitted

    run(8)  # warm-up: kernels compiled, pools allocated
    counter = OpCounter()
    if ops:  # a short run apart: counting walks each step's graph, which would skew the timings
        engine.step_timer = counter
        run(4, counter)
        engine.step_timer = NO_TIMER
    mx.reset_peak_memory()
    engine._peaks = PeakWindow(window_s=math.inf)  # the engine restarts MLX's mark each step: keep them all
    if breakdown:
        engine.step_timer = timer
    seconds, counted, first = run(tokens)
    peak = engine._peaks.recent()
    engine.step_timer = NO_TIMER
    device_ms = device_ms_per_step(engine, prompts) if breakdown and device_time else None
    engine.close()
    result = {"tok_s": counted / seconds if seconds > 0 else 0.0, "peak_bytes": peak, "all_started_s": first}
    if breakdown:
        result["breakdown_ms"] = timer.mean_ms() | ({"gpu": device_ms} if device_ms is not None else {})
        result["decode_s"] = seconds
    if ops:
        result["ops"] = {"per_step": counter.mean(), "layers": layers, "by_name": counter.by_name()}
    return result


def device_ms_per_step(engine, prompts: list[list[int]], steps: int = 32) -> float | None:
    """The device's busy ms per decode step (CUDA, through CUPTI: kernel_times.py), over `steps` steps
    of every row decoding, in a run apart (the profiler slows the host). None off CUDA or without
    torch."""
    from kinfer.engines.base import GenerationJob
    from kinfer.engines.mlx import kernels
    from kinfer.protocol import Sampling

    if not kernels.on_cuda_gpu():
        return None
    try:
        from kernel_times import KernelTimes  # scripts/, this script's folder
    except ImportError:
        return None
    for i, p in enumerate(prompts):
        job = GenerationJob(
            f"g{i}", tuple(p), Sampling(temperature=0.0), max_tokens=steps + 16, ignore_eos=True
        )
        engine.submit(job)
    started: set[str] = set()
    while len(started) < len(prompts):
        started.update(u.job_id for u in engine.step() if u.new_tokens)
    mx.synchronize()
    try:
        with KernelTimes() as times:
            for _ in range(steps):
                engine.step()
            mx.synchronize()
    except ImportError:  # no torch here
        times = None
    while engine.has_work:
        engine.step()
    return times.busy_us() / 1000 / steps if times is not None else None


def breakdown_line(cells: dict[str, float]) -> str:
    """One row count's mean ms per decode step, by phase (and the device's busy ms, where measured)."""
    keys = ("build", "launch", "wait", "other", "total", "gpu")
    return "  ".join(f"{key} {cells[key]:.3f}" for key in keys if key in cells) + (
        f"  ms/step over {int(cells['steps'])} steps"
    )


def bench_mlx_lm(path: Path, prompts: list[list[int]], tokens: int) -> dict:
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    rows = len(prompts)

    def run(max_tokens: int) -> tuple[float, int, float]:
        submitted = time.perf_counter()
        gen = BatchGenerator(
            model,
            max_tokens=max_tokens,
            completion_batch_size=rows,
            prefill_batch_size=min(rows, 16),
            prefill_step_size=2048,
        )
        gen.insert(prompts, max_tokens=[max_tokens] * rows)
        started: set[int] = set()
        t0, counted, done = None, 0, 0
        while done < rows:
            responses = gen.next_generated()
            if not responses:
                break
            for r in responses:
                if t0 is not None:
                    counted += 1
                started.add(r.uid)
                done += r.finish_reason is not None
            if t0 is None and len(started) == rows:
                t0 = time.perf_counter()
        end = time.perf_counter()
        gen.close()
        return end - (t0 or end), counted, (t0 or end) - submitted

    run(8)
    mx.reset_peak_memory()
    seconds, counted, first = run(tokens)
    peak = mx.get_peak_memory()
    mx.clear_cache()
    return {"tok_s": counted / seconds if seconds > 0 else 0.0, "peak_bytes": peak, "all_started_s": first}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="qwen3-0.6b,qwen3.5-0.8b", help="comma separated: " + ",".join(SHAPES)
    )
    parser.add_argument("--rows", default="1,4,16,64", help="comma separated row counts")
    parser.add_argument("--tokens", type=int, default=256, help="tokens generated per row")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--engines", default="kinfer,mlx-lm", help="which to run: kinfer, mlx-lm")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument(
        "--precompiled-kernels",
        action="store_true",
        help="kinfer on CUDA: its kernels compiled once, launched precompiled (default: mx.fast.cuda_kernel)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="kinfer: mean host ms per decode step by phase (build/launch/wait/other)",
    )
    parser.add_argument(
        "--no-device-time",
        action="store_true",
        help="--breakdown without its gpu column (no CUPTI run after the timed one)",
    )
    parser.add_argument(
        "--ops",
        action="store_true",
        help="kinfer: primitives in one decode step's graph (graph_ops.py; a short run apart)",
    )
    parser.add_argument(
        "--compiled-step",
        default="on",
        choices=("on", "off"),
        help="kinfer: the compiled decode step (the mlx_compiled_step setting; compiled_step.py)",
    )
    parser.add_argument(
        "--fuse-projections",
        default="auto",
        choices=("auto", "on", "off"),
        help="kinfer: q/k/v and gate/up fused (auto: on a GPU only, as the server; fuse.py)",
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny shapes, rows 1,4, 16 tokens: a CPU smoke test"
    )
    parser.add_argument(
        "--layers", type=int, default=0, help="override the shapes' layer count (e.g. --tiny --layers 28)"
    )
    parser.add_argument("--workdir", type=Path, help="keep the model directories here (default: a temp dir)")
    args = parser.parse_args()

    shapes = TINY if args.tiny else SHAPES
    if args.tiny:
        args.rows = "1,4" if args.rows == "1,4,16,64" else args.rows
        args.tokens = min(args.tokens, 16)
        args.prompt = min(args.prompt, 16)
    sizes = [s for s in args.sizes.split(",") if s]
    row_counts = [int(r) for r in args.rows.split(",") if r]
    engines = [e for e in args.engines.split(",") if e]
    results = {
        "device": str(mx.default_device()),
        "dtype": args.dtype,
        "prompt": args.prompt,
        "tokens": args.tokens,
        "kinfer_kernels": "precompiled" if args.precompiled_kernels else "jit",
        "kinfer_compiled_step": args.compiled_step,
        "runs": [],
    }
    print(f"device {mx.default_device()}, {args.dtype}, prompts {args.prompt}, {args.tokens} tokens per row")
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="kinfer-bench-"))
        )
        for size in sizes:
            config = shapes[size]
            if args.layers:
                config = with_layers(config, args.layers)
            name = f"{size}-{args.layers}-layers" if args.layers else size
            path = build_model_dir(workdir / name, config, args.dtype)
            vocab = config.get("text_config", config)["vocab_size"]
            for rows in row_counts:
                prompts = make_prompts(rows, args.prompt, vocab)
                row = {"size": size, "rows": rows}
                for engine in engines:
                    if engine == "kinfer":
                        row[engine] = bench_kinfer(
                            path,
                            prompts,
                            args.tokens,
                            args.breakdown,
                            precompiled=args.precompiled_kernels,
                            compiled_step=args.compiled_step == "on",
                            ops=args.ops,
                            fuse_projections=parse_switch(args.fuse_projections, auto=True),
                            device_time=not args.no_device_time,
                        )
                    else:
                        row[engine] = bench_mlx_lm(path, prompts, args.tokens)
                results["runs"].append(row)
                cells = "  ".join(
                    f"{e} {row[e]['tok_s']:8.1f} tok/s (peak {row[e]['peak_bytes'] / 2**30:.2f} GiB,"
                    f" all started {row[e]['all_started_s']:.2f} s)"
                    for e in engines
                )
                ratio = ""
                if "kinfer" in row and "mlx-lm" in row and row["mlx-lm"]["tok_s"]:
                    ratio = f"  x{row['kinfer']['tok_s'] / row['mlx-lm']['tok_s']:.2f}"
                print(f"{size:14s} rows {rows:3d}  {cells}{ratio}", flush=True)
                if "breakdown_ms" in row.get("kinfer", {}):
                    print(
                        f"{'':14s} kinfer step: {breakdown_line(row['kinfer']['breakdown_ms'])}", flush=True
                    )
                if "ops" in row.get("kinfer", {}):
                    o = row["kinfer"]["ops"]
                    top = ", ".join(f"{k} {v:g}" for k, v in list(o["by_name"].items())[:8])
                    print(
                        f"{'':14s} kinfer graph: {o['per_step']:.0f} primitives per decode step"
                        f" ({o['per_step'] / o['layers']:.1f} per layer, {o['layers']} layers): {top}",
                        flush=True,
                    )
    print()
    print("| model | rows | " + " | ".join(f"{e} tok/s" for e in engines) + " | kinfer / mlx-lm |")
    print("|---|---|" + "---|" * len(engines) + "---|")
    for row in results["runs"]:
        ratio = (
            f"{row['kinfer']['tok_s'] / row['mlx-lm']['tok_s']:.2f}"
            if "kinfer" in row and "mlx-lm" in row and row["mlx-lm"]["tok_s"]
            else ""
        )
        cells = " | ".join(f"{row[e]['tok_s']:.1f}" for e in engines)
        print(f"| {row['size']} | {row['rows']} | {cells} | {ratio} |")
    if args.breakdown and "kinfer" in engines:
        print()
        print("| model | rows | build ms | launch ms | wait ms | other ms | step ms | GPU busy ms | steps |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in results["runs"]:
            b = row["kinfer"]["breakdown_ms"]
            cells = " | ".join(
                f"{b[k]:.3f}" if k in b else "-" for k in ("build", "launch", "wait", "other", "total", "gpu")
            )
            print(f"| {row['size']} | {row['rows']} | {cells} | {int(b['steps'])} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
