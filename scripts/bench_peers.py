"""kinfer and its peers on the same weights, in one run: the same sweep against each server in turn.

    python scripts/bench_peers.py                                  # bundled SmolLM2 on this CPU
    python scripts/bench_peers.py --gguf m.gguf --mlx-dir m/ --concurrency 1,4,16,64 --gpu

Targets (`--targets`, default all whose weights are known):
  kinfer-llama   kinfer --headless on the GGUF (llama.cpp engine)
  llama-cpp      llama-cpp-python's own server on the same GGUF (one request at a time)
  mlx-lm         mlx_lm.server on the HF folder
  kinfer-mlx     kinfer --headless on the HF folder (MLX engine)
  kinfer-llama-f32  kinfer --headless on the F32 GGUF of the same conversion (not by default)
  llama-server   llama.cpp's own C++ server on the GGUF (`--llama-server PATH`; not by default)

`--rounds N` runs the targets N times in turn (ABAB), each labelled with its round.

Without --mlx-dir the MLX targets run on an f32 conversion of the GGUF (dequantized by
kinfer/testing/smollm_f32.py, cached under ~/.cache/kinfer-tests). Servers run one at a time so they never
compete for cores; every reply runs to --max-tokens (kinfer: ignore_eos; the peers: a -100 logit bias
on the end-of-turn tokens), greedy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from kinfer.bench import report
from kinfer.bench.servers import (
    LaunchedServer,
    start_kinfer,
    start_llama_cpp_server,
    start_llama_server,
    start_mlx_lm_server,
)
from kinfer.bench.sweep import SweepConfig, SweepRun, run_sweep
from kinfer.engines.llama.sizing import available_threads
from kinfer.store.bundled import bundled_gguf

TARGETS = ("kinfer-llama", "llama-cpp", "mlx-lm", "kinfer-mlx", "kinfer-llama-f32", "llama-server")
DEFAULT_TARGETS = TARGETS[:4]
LABELS = {
    "kinfer-llama": "kinfer llama.cpp",
    "kinfer-llama-f32": "kinfer llama.cpp f32",
    "llama-cpp": "llama-cpp-python server",
    "mlx-lm": "mlx_lm.server",
    "kinfer-mlx": "kinfer MLX",
    "llama-server": "llama-server (C++)",
}


def f32_forms(gguf: Path) -> tuple[Path, Path]:
    """(HF folder, F32 GGUF) dequantized from `gguf`, cached by kinfer/testing/smollm_f32.py."""
    from kinfer.testing.smollm_f32 import build_smollm_f32

    print(f"f32 forms of {gguf.name} (cached after the first build) ...", flush=True)
    model = build_smollm_f32(gguf)
    return model.hf_dir, model.gguf


def start(name: str, args: argparse.Namespace, logs: Path) -> LaunchedServer:
    rows = max(args.concurrency)
    ctx = int(args.prompt_tokens * 1.25) + args.max_tokens + 256
    label = LABELS[name]
    if name in ("kinfer-llama", "kinfer-llama-f32"):
        weights = args.gguf if name == "kinfer-llama" else args.f32_gguf
        return start_kinfer(
            weights=weights,
            parallel=rows,
            ctx=ctx,
            threads=args.threads,
            label=label,
            log_dir=logs,
            extra_args=args.kinfer_args,
        )
    if name == "llama-cpp":
        gpu_layers = -1 if args.gpu else 0
        return start_llama_cpp_server(
            args.gguf, ctx=ctx, threads=args.threads, gpu_layers=gpu_layers, log_dir=logs, label=label
        )
    if name == "llama-server":
        if args.llama_server is None:
            raise SystemExit("the llama-server target needs --llama-server PATH")
        return start_llama_server(
            args.llama_server,
            args.gguf,
            parallel=rows,
            ctx=ctx,
            threads=args.threads,
            gpu_layers=999 if args.gpu else 0,
            log_dir=logs,
            label=label,
            extra_args=tuple(args.llama_server_args.split()),
        )
    if name == "mlx-lm":
        return start_mlx_lm_server(args.mlx_dir, concurrency=rows, log_dir=logs, label=label)
    return start_kinfer(
        weights=args.mlx_dir, parallel=rows, ctx=ctx, label=label, log_dir=logs, extra_args=args.kinfer_args
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", type=Path, help="GGUF for the llama.cpp targets (default: bundled SmolLM2)")
    parser.add_argument("--mlx-dir", type=Path, help="HF folder for the MLX targets (default: f32 of --gguf)")
    parser.add_argument(
        "--targets", default=",".join(DEFAULT_TARGETS), help="comma separated: " + ",".join(TARGETS)
    )
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-level", type=int)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all)")
    parser.add_argument(
        "--kinfer-args",
        default="",
        help="more arguments for the kinfer servers, space separated, e.g. '--flash-attn on'",
    )
    parser.add_argument("--gpu", action="store_true", help="offload llama-cpp-python's layers to the GPU")
    parser.add_argument(
        "--llama-server", type=Path, help="llama.cpp's C++ llama-server binary (target llama-server)"
    )
    parser.add_argument(
        "--llama-server-args", default="", help="more llama-server flags, e.g. '-fa off' (one string)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the targets this many times, in turn (ABAB)"
    )
    parser.add_argument("--label-suffix", default="", help="appended to every label, e.g. ' (qwen3-0.6b)'")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="also write the tables as markdown here")
    args = parser.parse_args()
    args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    args.threads = args.threads or available_threads()
    args.kinfer_args = tuple(args.kinfer_args.split())
    args.gguf = args.gguf or bundled_gguf()
    names = [t for t in args.targets.split(",") if t]
    unknown = set(names) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if args.gguf is None and any(n in ("kinfer-llama", "llama-cpp") for n in names):
        parser.error("no --gguf and the bundled model is not installed")
    args.f32_gguf = None
    if (args.mlx_dir is None and {"mlx-lm", "kinfer-mlx"} & set(names)) or "kinfer-llama-f32" in names:
        hf_dir, args.f32_gguf = f32_forms(args.gguf)
        args.mlx_dir = args.mlx_dir or hf_dir
    config = SweepConfig(
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        requests_per_level=args.requests_per_level,
    )
    logs = Path(tempfile.mkdtemp(prefix="kinfer-bench-logs-"))
    print(f"machine: {report.machine_line()}", flush=True)
    print(f"gguf: {args.gguf}\nmlx: {args.mlx_dir}\nlogs: {logs}", flush=True)
    runs: list[SweepRun] = []
    base_labels = dict(LABELS)
    for round_, name in ((r, n) for r in range(1, args.rounds + 1) for n in names):
        LABELS[name] = base_labels[name] + args.label_suffix + (f" #{round_}" if args.rounds > 1 else "")
        try:
            with start(name, args, logs) as server:

                def progress(level, label=server.target.label) -> None:
                    ttft = "-" if level.ttft_p50 is None else f"{level.ttft_p50:.2f} / {level.ttft_p95:.2f} s"
                    tps = f"{level.aggregate_tps:.1f} tok/s"
                    print(f"  {label} c={level.concurrency}: {tps}, TTFT p50 / p95 {ttft}", flush=True)

                # same tokenizer everywhere: a server that cannot be calibrated borrows the last one's sizing
                fallback = next((r.sizer for r in reversed(runs) if r.sizer.calibrated), None)
                runs.append(
                    asyncio.run(run_sweep(server.target, config, on_level=progress, fallback_sizer=fallback))
                )
        except RuntimeError as exc:  # a peer that cannot start must not lose the others' numbers
            print(f"{LABELS[name]}: {exc}", file=sys.stderr, flush=True)
            continue
        print(report.sweep_table(runs[-1]), flush=True)
        write_reports(args, runs)  # after every server: a run cut short keeps what it measured
    if not runs:
        return 1
    print()
    print(report.comparison_table(runs))
    print()
    print(report.plot(runs))
    return 0


def write_reports(args: argparse.Namespace, runs: list[SweepRun]) -> None:
    """The markdown and JSON reports of the runs so far (`--markdown`, `--json`)."""
    command = "python scripts/bench_peers.py " + " ".join(sys.argv[1:])
    blocks = [
        f"Command: `{command}`",
        f"Machine: {report.machine_line()}",
        "Aggregate tok/s:\n\n" + report.comparison_table(runs, markdown=True),
        "TTFT p50:\n\n" + report.comparison_table(runs, markdown=True, metric="ttft"),
        *(report.sweep_table(run, markdown=True) for run in runs),
    ]
    if args.markdown:
        args.markdown.write_text("\n\n".join(blocks) + "\n")
    if args.json:
        args.json.write_text(json.dumps(report.report_json(runs, command=command), indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
