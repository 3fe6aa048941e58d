"""Drive the MLX engine through one scenario and log every step, for a native profiler to watch.

    python scripts/profile_steps.py stall --weights DIR --rows 16 --prompt-tokens 50000 --json out.json
    python scripts/profile_steps.py decode --weights DIR --rows 1 --steps 400 --json out.json
    py-spy record --native --rate 250 --format raw -o stacks.txt -- python scripts/profile_steps.py ...
    python scripts/profile_steps.py stall ... --kernels 8 --kernels-at 0.9   # device time by kernel (CUDA)

`stall`: `rows` replies decode, then one long prompt arrives and is prefilled beside them (issue 18's
"no stalls" case, without HTTP); `decode`: `rows` replies decode for `steps` steps (issue 20's step).
The JSON holds every step of the timed window (ms, the step timer's phases, prompt positions
prefilled, rows decoding), so a profile's samples can be read against the steps they fell in.
No server, no scheduler: the engine as the scheduler's worker thread drives it.

`--kernels N` records every CUDA kernel of N steps through CUPTI (kernel_times.py; torch on the
machine): in `stall` once the long prompt is `--kernels-at` of the way in, in `decode` the last N
steps; the JSON's `kernels` holds device time by kernel, and each profiled step has `kernels: true`.
With `--kernels-per-step` each of those steps is read apart (each profiled step's `kernel_step`: its
host CUDA calls, the graphs it instantiated), a line each: which step of a window met what.

First sightings: with MLX_PTX_CACHE_DIR set to an empty folder, each step also lists the CUDA modules
MLX's JIT compiled during it (a new .ptx file there: 1-4 s of NVRTC each on the H200), and `stall`
varies its rows as serving does (replies ending at different steps and replaced, sampled rows,
penalties, logprobs, a logit bias), so a kernel the warm-up left out shows up as the step it stalled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import time
from pathlib import Path


def _engine(weights: Path, rows: int, ctx: int):
    from kinfer.engines.mlx.cuda_graphs import keep_graphs
    from kinfer.engines.mlx.engine import MlxEngine
    from kinfer.engines.mlx.step_timer import StepTimer

    keep_graphs()  # as the server's loader does: without it MLX keeps 400 graphs and evicts the warm-up's
    engine = MlxEngine(weights, name="profile", rows=rows, ctx=ctx, prefix_cache=False)
    engine.step_timer = StepTimer()
    return engine


def _job(job_id: str, tokens: int, max_tokens: int, vocab: int, kind: int = 0):
    """kind 0: greedy; 1: sampled (the defaults); 2: repeat penalty; 3: logprobs; 4: a logit bias."""
    from kinfer.engines.base import GenerationJob
    from kinfer.protocol import Sampling

    prompt = tuple(random.randrange(100, vocab - 100) for _ in range(tokens))
    sampling = [
        Sampling(temperature=0.0),
        Sampling(seed=kind),
        Sampling(temperature=0.0, repeat_penalty=1.1),
        Sampling(temperature=0.0, logprobs=3),
        Sampling(temperature=0.0, logit_bias=((vocab // 2, 5.0),)),
    ][kind % 5]
    return GenerationJob(job_id, prompt, sampling, max_tokens=max_tokens, ignore_eos=True)


class PtxWatch:
    """New files in MLX's PTX cache folder (MLX_PTX_CACHE_DIR): the modules its JIT compiled since."""

    def __init__(self) -> None:
        self.folder = os.environ.get("MLX_PTX_CACHE_DIR")
        self.seen = self._names()

    def _names(self) -> set[str]:
        if not self.folder or not os.path.isdir(self.folder):
            return set()
        return {n[:-4] for n in os.listdir(self.folder) if n.endswith(".ptx")}

    def new(self) -> list[str]:
        names = self._names()
        fresh, self.seen = sorted(names - self.seen), names
        return fresh


WATCH: PtxWatch | None = None


def _step(engine, log: list[dict], began: float) -> list:
    start = time.perf_counter()
    updates = engine.step()
    ms = (time.perf_counter() - start) * 1000
    phases = engine.step_timer.steps[-1] if engine.step_timer.steps else {}
    engine.step_timer.steps.clear()
    active = [row for row in engine._slots if row is not None]
    log.append(
        {
            "t": start - began,
            "ms": ms,
            "prefill": engine._step_prefill,
            "decoding": sum(1 for row in active if row.ready),
            **{k: v * 1000 for k, v in phases.items()},
            "compiled": WATCH.new() if WATCH else [],
        }
    )
    return updates


class KernelWindow:
    """`steps` consecutive steps under CUPTI from `begin()` on (kernel_times.py); others run untouched.
    `per_step`: each step marked (torch.profiler.record_function) and read apart, a line each: its host
    CUDA calls and the graphs it instantiated, so a slow step is told apart from its neighbours."""

    def __init__(self, steps: int, per_step: bool = False) -> None:
        self.left, self.open, self.times = steps, None, None
        self.per_step = per_step
        self.marked: list[dict] = []  # the marked steps' log entries, in order

    def begin(self) -> None:
        if self.left > 0 and self.open is None and self.times is None:
            import mlx.core as mx
            from kernel_times import KernelTimes  # scripts/, the script's own folder, is on sys.path

            mx.synchronize()  # the window holds only its own steps' kernels
            self.open = KernelTimes(marks=self.per_step).__enter__()

    def mark(self):
        """A context for one step: a named range in the trace while the window is open."""
        if self.open is None or not self.per_step:
            return contextlib.nullcontext()
        from torch.profiler import record_function

        return record_function(f"step {len(self.marked)}")

    def after_step(self, log: list[dict]) -> None:
        if self.open is None:
            return
        log[-1]["kernels"] = True
        self.marked.append(log[-1])
        self.left -= 1
        if self.left == 0:
            import mlx.core as mx

            mx.synchronize()
            self.open.__exit__(None, None, None)
            self.open, self.times = None, self.open
            if not self.per_step:
                print(self.times.table(), flush=True)
                return
            if len(self.times.marks) != len(self.marked):
                print(f"per step: {len(self.times.marks)} marks for {len(self.marked)} steps", flush=True)
            for step, mark in zip(self.marked, self.times.marks, strict=False):
                step["kernel_step"] = _step_calls(self.times.within(mark))
                print(_step_line(step), flush=True)

    def result(self, log: list[dict]) -> dict:
        if self.times is None:
            return {}
        profiled = [s["ms"] for s in log if s.get("kernels")]
        return {"kernels": self.times.summary() | {"steps": len(profiled), "step_ms": profiled}}


def _step_calls(times) -> dict:
    """One step's host CUDA calls and the graphs it instantiated (their kernels, in order)."""
    from kernel_times import runs

    return {
        "api_calls": times.by_api_call()[:15],
        "launched_graphs": times.launched_graphs(),
        "launched_runs": [runs(kernels) for kernels in times.launched_kernels()],
        "new_graphs": [
            {"instantiate_us": g["instantiate_us"], "kernels": len(g["kernels"]), "runs": runs(g["kernels"])}
            for g in times.new_graphs()
        ],
    }


def _most(calls, count: int) -> list[dict]:
    return sorted(calls, key=lambda c: -c["total_ms"])[:count]


def _step_line(step: dict) -> str:
    calls = {c["call"]: c for c in step["kernel_step"]["api_calls"]}

    def took(name: str) -> str:
        c = calls.get(name)
        return f"{c['calls']} x {c['total_ms']:.2f} ms" if c else "0"

    lines = [
        f"step {step['ms']:.1f} ms prefill {step.get('prefill')} fed {step.get('fed')}: instantiate "
        f"{took('cudaGraphInstantiate')}, update {took('cudaGraphExecUpdate')}, launch "
        f"{took('cudaGraphLaunch')}, exec destroy {took('cudaGraphExecDestroy')}, malloc "
        f"{took('cudaMallocAsync')}, free {took('cudaFreeAsync')}; the most host time: "
        + ", ".join(f"{c['call']} {c['calls']} x {c['total_ms']:.2f} ms" for c in _most(calls.values(), 3))
    ]
    lines.append(f"  graphs launched (kernels each): {step['kernel_step']['launched_graphs']}")
    for graph in step["kernel_step"]["new_graphs"]:
        head = f"  new graph ({graph['instantiate_us']:.0f} us) {graph['kernels']} kernels"
        lines.append(f"{head}: {graph['runs'][:300]}")
    # every launched graph whole, for read_step_log.py --diff-graphs
    lines.extend(f"  graph {i}: {kernels}" for i, kernels in enumerate(step["kernel_step"]["launched_runs"]))
    return "\n".join(lines)


def stall(args: argparse.Namespace) -> dict:
    engine = _engine(args.weights, args.rows + 1, args.ctx)
    vocab = engine._tokenizer.vocab_size
    global WATCH
    WATCH = PtxWatch()  # after the load and its warm-up
    count = 0

    def submit(tokens: int = 128) -> None:  # replies of different lengths and kinds, so rows come and go
        nonlocal count
        length = args.row_tokens or 24 + 11 * (count % 7)
        engine.submit(_job(f"r{count}", tokens, length, vocab, kind=0 if args.row_tokens else count))
        count += 1

    for _ in range(args.rows):
        submit()
    log: list[dict] = []
    began = time.perf_counter()

    window = KernelWindow(args.kernels, args.kernels_per_step)
    long_row = None  # the long prompt's row, once it is submitted

    def step() -> list:
        with window.mark():
            updates = _step(engine, log, began)
        log[-1]["fed"] = long_row.fed if long_row is not None else None
        window.after_step(log)
        for u in updates:
            if u.finish is not None and u.job_id != "long":
                submit(64 + 32 * (count % 3))
        return updates

    for _ in range(args.before):
        step()
    engine.submit(_job("long", args.prompt_tokens, 8, vocab))
    first = None
    long_row = next(r for r in engine._slots if r is not None and r.job.job_id == "long")
    while first is None:
        if long_row.fed >= args.kernels_at * args.prompt_tokens:
            window.begin()
        if any(u.job_id == "long" and u.new_tokens for u in step()):
            first = time.perf_counter() - began
    for _ in range(args.after):
        step()
    engine.close()
    beside = [s["ms"] for s in log if s["prefill"] and s["decoding"] >= args.rows - 2]
    alone = [s["ms"] for s in log if not s["prefill"]]
    return {
        "steps": log,
        "long_first_token_s": first,
        "prefill_steps_ms": beside,
        "decode_median_ms": _median(alone),
    } | window.result(log)


def decode(args: argparse.Namespace) -> dict:
    engine = _engine(args.weights, args.rows, 128 + args.steps + 64)
    global WATCH
    WATCH = PtxWatch()
    vocab = engine._tokenizer.vocab_size
    for i in range(args.rows):
        engine.submit(_job(f"r{i}", 128, args.steps + 32, vocab))
    log: list[dict] = []
    began = time.perf_counter()
    while sum(1 for row in engine._slots if row is not None and row.ready) < args.rows:
        _step(engine, [], began)
    window = KernelWindow(args.kernels)
    for i in range(args.steps):
        if i == args.steps - args.kernels:
            window.begin()
        _step(engine, log, began)
        window.after_step(log)
    engine.close()
    return {"steps": log, "decode_median_ms": _median([s["ms"] for s in log])} | window.result(log)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=("stall", "decode"))
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=50000)
    parser.add_argument("--ctx", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=400, help="decode: steps timed")
    parser.add_argument("--before", type=int, default=20, help="stall: decode steps logged before the prompt")
    parser.add_argument("--after", type=int, default=20, help="stall: steps logged after its first token")
    parser.add_argument(
        "--row-tokens",
        type=int,
        default=0,
        help="stall: each reply's length, greedy (0: short replies of five kinds, replaced as they end)",
    )
    parser.add_argument("--kernels", type=int, default=0, help="steps to record kernel by kernel (CUDA)")
    parser.add_argument(
        "--kernels-at", type=float, default=0.9, help="stall: share of the long prompt in before recording"
    )
    parser.add_argument(
        "--kernels-per-step", action="store_true", help="record each of those steps apart (a line each)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    random.seed(0)
    result = stall(args) if args.scenario == "stall" else decode(args)
    steps = result["steps"]
    print(f"{args.scenario}: {len(steps)} steps, decode median {result['decode_median_ms']:.2f} ms")
    if args.scenario == "stall":
        beside = result["prefill_steps_ms"]
        print(f"prefill beside decoding rows: {len(beside)} steps, ms: {[round(m, 1) for m in beside]}")
        print(f"long prompt's first token after {result['long_first_token_s']:.2f} s")
        # from the long prompt's arrival on: chunk steps, its row joining and leaving, the steps after
        slowest = sorted(range(args.before, len(steps)), key=lambda i: -steps[i]["ms"])[:8]
        for i in slowest:
            step = steps[i]
            print(
                f"  step {i}: {step['ms']:.1f} ms, prefill {step['prefill']}, decoding {step['decoding']}, "
                f"launch {step.get('launch', 0):.1f}, cpu_launch {step.get('cpu_launch', 0):.1f}"
            )
    compiled = [(i, round(s["ms"], 1), s["compiled"]) for i, s in enumerate(steps) if s["compiled"]]
    print(f"first sightings after the load (step, ms, modules): {compiled}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
