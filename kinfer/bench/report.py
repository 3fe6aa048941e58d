"""Benchmark output: text tables, markdown tables (for docs/benchmarks.md), terminal bars and JSON."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import psutil

from kinfer import __version__
from kinfer.bench.clients import Target
from kinfer.bench.prefix import PrefixRun
from kinfer.bench.stats import LevelSummary
from kinfer.bench.sweep import SweepRun

JSON_KIND = "kinfer-bench"
JSON_VERSION = 1
BAR_WIDTH = 40
_EIGHTHS = " ▏▎▍▌▋▊▉"

Run = SweepRun | PrefixRun


# ---- numbers ----------------------------------------------------------------------------------


def fmt(value: float | int | None, digits: int = 1, unit: str = "") -> str:
    """A number for a table cell; '-' when it was not measured."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    return f"{value:.{digits}f}{unit}"


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


# ---- tables -----------------------------------------------------------------------------------

LEVEL_HEADERS = (
    "conc",
    "reqs",
    "err",
    "agg tok/s",
    "stream tok/s",
    "TTFT p50",
    "TTFT p95",
    "prompt tok/s",
    "prompt tok",
    "gen tok",
    "RSS MiB",
    "engine MiB",
)


def level_row(level: LevelSummary) -> list[str]:
    return [
        str(level.concurrency),
        str(level.requests),
        str(level.errors),
        fmt(level.aggregate_tps),
        fmt(level.stream_tps_p50),
        seconds(level.ttft_p50),
        seconds(level.ttft_p95),
        fmt(level.prompt_tps_p50, 0),
        str(round(level.prompt_tokens / level.ok)) if level.ok else "-",
        str(level.completion_tokens),
        mib(level.memory.rss_bytes),
        mib(level.memory.engine_total),
    ]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, numbers right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "| " + " | ".join(headers) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(r) + " |" for r in rows)])


def target_title(target: Target) -> str:
    model = f", model {target.model}" if target.model else ""
    return f"{target.label} ({target.dialect} at {target.url}{model})"


def run_title(run: Run) -> str:
    return target_title(run.target)


def sweep_rows(run: SweepRun) -> list[list[str]]:
    return [level_row(level) for level in run.levels]


def sweep_table(run: SweepRun, *, markdown: bool = False) -> str:
    c = run.config
    head = f"{run_title(run)}: prompt ~{c.prompt_tokens} tokens, {c.max_tokens} generated per request"
    table = (markdown_table if markdown else text_table)(LEVEL_HEADERS, sweep_rows(run))
    notes = "".join(f"\nnote: {n}" for n in run.notes)
    retries = sum(level.retries for level in run.levels)
    if retries:
        notes += (
            f"\nnote: {retries} connections failed before any response and were retried"
            " (as the openai SDK does)"
        )
    short = sum(level.short_replies for level in run.levels)
    if short:
        notes += f"\nnote: {short} replies stopped before max_tokens (the server ended them early)"
    return f"{head}\n{table}{notes}"


def comparison_table(runs: Sequence[SweepRun], *, markdown: bool = False, metric: str = "aggregate") -> str:
    """One row per concurrency, one column per target: aggregate tok/s (or TTFT p50)."""
    levels = sorted({level.concurrency for run in runs for level in run.levels})
    headers = ["concurrency", *(run.target.label for run in runs)]
    rows = []
    for c in levels:
        cells = [str(c)]
        for run in runs:
            level = next((lv for lv in run.levels if lv.concurrency == c), None)
            if level is None:
                cells.append("-")
            elif metric == "ttft":
                cells.append(seconds(level.ttft_p50))
            else:
                cells.append(fmt(level.aggregate_tps) + (f" ({level.errors} err)" if level.errors else ""))
        rows.append(cells)
    return (markdown_table if markdown else text_table)(headers, rows)


def prefix_table(run: PrefixRun, *, markdown: bool = False) -> str:
    cold = run.steps[0].result.ttft if run.steps else None
    headers = ("step", "prompt tok", "reused tok", "TTFT", "vs cold", "gen tok", "error")
    rows = []
    for step in run.steps:
        r = step.result
        speedup = f"{cold / r.ttft:.1f}x faster" if cold and r.ttft and step is not run.steps[0] else ""
        counted = r.usage_source == "usage"  # without usage the server never said what it reused
        rows.append(
            [
                step.name,
                str(r.prompt_tokens) if counted else "-",
                str(r.cached_tokens) if counted else "-",
                seconds(r.ttft),
                speedup,
                str(r.completion_tokens),
                r.error or "",
            ]
        )
    c = run.config
    head = f"{run_title(run)}: system prompt ~{c.system_tokens} tokens, {c.max_tokens} generated per turn"
    notes = "".join(f"\nnote: {n}" for n in run.notes)
    return f"{head}\n{(markdown_table if markdown else text_table)(headers, rows)}{notes}"


# ---- bars -------------------------------------------------------------------------------------


def bar(value: float, top: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar `width` cells wide at `top`, in eighths of a cell."""
    if top <= 0 or value <= 0:
        return ""
    eighths = round(min(value, top) / top * width * 8)
    return "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")


def plot(runs: Sequence[SweepRun], metric: str = "aggregate_tps", title: str = "aggregate tok/s") -> str:
    """Bars of one level metric: a group per concurrency, a bar per target."""
    values = {
        (run.target.label, level.concurrency): getattr(level, metric) or 0.0
        for run in runs
        for level in run.levels
    }
    top = max(values.values(), default=0.0)
    label_width = max((len(run.target.label) for run in runs), default=0)
    width = min(BAR_WIDTH, max(10, shutil.get_terminal_size((100, 24)).columns - label_width - 24))
    lines = [title]
    for c in sorted({level.concurrency for run in runs for level in run.levels}):
        for i, run in enumerate(runs):
            if (run.target.label, c) not in values:
                continue
            value = values[(run.target.label, c)]
            prefix = f"c={c:<4}" if i == 0 else " " * 6
            lines.append(
                f"{prefix} {run.target.label:<{label_width}} |{bar(value, top, width):<{width}}| {value:.1f}"
            )
    return "\n".join(lines)


# ---- the machine and JSON ---------------------------------------------------------------------


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine_info() -> dict[str, Any]:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    return {
        "cpu": cpu_name(),
        "cores": cores,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpu_names(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "kinfer": __version__,
    }


def machine_line(info: dict[str, Any] | None = None) -> str:
    info = info or machine_info()
    gpus = f", {', '.join(info['gpus'])}" if info["gpus"] else ""
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB{gpus}; "
        f"{info['os']}; Python {info['python']}; kinfer {info['kinfer']}"
    )


def run_json(run: Run) -> dict[str, Any]:
    t = run.target
    target = {"label": t.label, "url": t.url, "dialect": t.dialect, "model": t.model, "pid": t.pid}
    if isinstance(run, SweepRun):
        return {
            "scenario": "sweep",
            "target": target,
            "config": asdict(run.config),
            "calibration": asdict(run.sizer),
            "started_at": run.started_at,
            "notes": list(run.notes),
            "levels": [level_json(level) for level in run.levels],
        }
    return {
        "scenario": "prefix",
        "target": target,
        "config": asdict(run.config),
        "started_at": run.started_at,
        "notes": list(run.notes),
        "steps": [
            {
                "name": s.name,
                "ok": s.result.ok,
                "prompt_tokens": s.result.prompt_tokens,
                "cached_tokens": s.result.cached_tokens,
                "completion_tokens": s.result.completion_tokens,
                "ttft_s": s.result.ttft,
                "usage_source": s.result.usage_source,
                "error": s.result.error,
            }
            for s in run.steps
        ],
    }


def level_json(level: LevelSummary) -> dict[str, Any]:
    data = asdict(level)
    data["usage_sources"] = list(level.usage_sources)
    data["error_messages"] = list(level.error_messages)
    data["memory"] = {
        "rss_bytes": level.memory.rss_bytes,
        "engine_bytes": dict(level.memory.engine_bytes),
        "engine_at_peak": dict(level.memory.at_peak),
        "engine_total_bytes": level.memory.engine_total,
        "engine_named_share": level.memory.named_share,
    }
    return data


def report_json(
    runs: Sequence[Run], *, command: str = "", machine: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The whole benchmark as one JSON document (`--json FILE`)."""
    return {
        "kind": JSON_KIND,
        "version": JSON_VERSION,
        "command": command,
        "machine": machine or machine_info(),
        "runs": [run_json(run) for run in runs],
    }
