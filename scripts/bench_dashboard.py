"""Does the dashboard slow serving down? The same sweep against `kinfer --headless` and the dashboard.

    python scripts/bench_dashboard.py                      # bundled SmolLM2, concurrency 4,8, 64 tokens
    python scripts/bench_dashboard.py --rounds 2 --json dashboard.json

The dashboard runs for real: `kinfer` (no --headless) inside a detached tmux session of 160x48 cells,
so Textual renders the live batch and gauges while the bench streams. Each round runs headless then
the dashboard (the order flips every other round so drift on a shared machine evens out). The ratio is
aggregate tok/s with the dashboard over headless, per level and over all levels; issue 8 asks >= 95 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from kinfer.bench import report
from kinfer.bench.servers import start_kinfer
from kinfer.bench.sweep import SweepConfig, SweepRun, run_sweep
from kinfer.store.bundled import BUNDLED_NAME

TARGET_RATIO = 0.95


def measure(dashboard: bool, args: argparse.Namespace, config: SweepConfig, logs: Path) -> SweepRun:
    label = "dashboard" if dashboard else "headless"
    home = Path(tempfile.mkdtemp(prefix="kinfer-bench-home-"))
    with start_kinfer(
        model=None if args.weights else args.model,
        weights=args.weights,
        home=None if args.weights else home,
        parallel=max(config.concurrency),
        threads=args.threads,
        label=label,
        log_dir=logs,
        dashboard=dashboard,
    ) as server:
        return asyncio.run(run_sweep(server.target, config))


def totals(runs: list[SweepRun]) -> tuple[int, float]:
    tokens = sum(level.completion_tokens for run in runs for level in run.levels)
    seconds = sum(level.wall_s for run in runs for level in run.levels)
    return tokens, seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=BUNDLED_NAME, help="a store model name")
    parser.add_argument("--weights", type=Path, help="or a GGUF file / HF folder")
    parser.add_argument("--concurrency", default="4,8")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-level", type=int)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="headless + dashboard pairs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = SweepConfig(
        concurrency=tuple(int(c) for c in args.concurrency.split(",")),
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        requests_per_level=args.requests_per_level,
    )
    logs = Path(tempfile.mkdtemp(prefix="kinfer-bench-logs-"))
    runs: dict[bool, list[SweepRun]] = {False: [], True: []}
    print(f"machine: {report.machine_line()}", flush=True)
    for i in range(args.rounds):
        for dashboard in (False, True) if i % 2 == 0 else (True, False):
            run = measure(dashboard, args, config, logs)
            runs[dashboard].append(run)
            print(report.sweep_table(run), flush=True)
    headless_tokens, headless_s = totals(runs[False])
    dash_tokens, dash_s = totals(runs[True])
    ratio = (dash_tokens / dash_s) / (headless_tokens / headless_s)
    rows = []
    for c in config.concurrency:

        def rate(dashboard: bool, c: int = c) -> float:
            levels = [lv for run in runs[dashboard] for lv in run.levels if lv.concurrency == c]
            return sum(lv.completion_tokens for lv in levels) / sum(lv.wall_s for lv in levels)

        rows.append(
            [str(c), f"{rate(False):.1f}", f"{rate(True):.1f}", f"{rate(True) / rate(False) * 100:.1f} %"]
        )
    rows.append(
        ["all", f"{headless_tokens / headless_s:.1f}", f"{dash_tokens / dash_s:.1f}", f"{ratio * 100:.1f} %"]
    )
    print()
    print(
        report.markdown_table(
            ["concurrency", "headless tok/s", "dashboard tok/s", "dashboard / headless"], rows
        )
    )
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    print(f"\ndashboard / headless = {ratio * 100:.1f} % ({verdict} the {TARGET_RATIO * 100:.0f} % target)")
    if args.json:
        document = report.report_json(
            runs[False] + runs[True], command="python scripts/bench_dashboard.py " + " ".join(sys.argv[1:])
        )
        document["dashboard_over_headless"] = ratio
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
