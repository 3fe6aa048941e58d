"""A stall run's step log in a few numbers: the long prompt's chunk steps by thirds, its slowest steps.

    python scripts/read_step_log.py steps-NAME.log.gz [...] [--rows 16]
    python scripts/read_step_log.py steps-NAME.log.gz --decode   # decode-only steps by rows decoding
    python scripts/read_step_log.py steps-NAME.log.gz --diff-graphs   # what made a step's graphs new

Reads logs written by scripts/step_log (`KINFER_STEP_HOOK`, every step with `KINFER_STEP_SLOW=0`), as
`scripts/bench_stalls.py` runs keep them beside their JSON. Of the steps with `--rows` rows decoding, the
ones that also prefilled (the long prompt's chunks) are cut into thirds in order; per third the median
step ms and its phases (build, launch, wait), then the slowest chunk step and the median of the
decode-only steps. One line per log, then `--slowest` lines (default 6), one per slowest step with the
rows decoding (with or without a chunk, the long prompt's row joining or not): its number in the log,
ms, what it prefilled, its launch against the engine thread's CPU time in it (`cpu_launch`, logs
since 2026-12-05's night: far less than the launch is a wait, not work), the garbage collection inside
it, what the allocator grew by at its launches and how its passes read their recurrent state.

`--diff-graphs` reads the steps a log recorded kernel by kernel (`KINFER_STEP_KERNELS`, logs since
2026-12-06): for each step that instantiated CUDA graphs, its kernels against the next recorded step's,
counted by name, as the kernels one ran more often than the other: what made its graphs new.

`--decode` reads a plain decoding run (a sweep's server) instead: per count of rows decoding, the
decode-only steps' median ms and phases, and the median time between two steps' ends less the later
step's own: what the serving loop spends outside `step` (handing tokens over, waiting for the GIL).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import re
import statistics
from collections import Counter
from pathlib import Path

FIELD = re.compile(r"(\w+)=([\d.]+)")
READS = re.compile(r"reads=(\S+)")
PHASES = ("total", "build", "launch", "wait", "other", "outside")  # --decode's columns


def read_steps(path: Path) -> list[dict]:
    """Each logged step's numeric fields (prefill, decoding, build, launch, wait, other, total) and
    `at`, the wall time its line was written (the step's end)."""
    with _lines(path) as lines:
        return [
            {"at": float(line.split()[0]), **{k: float(v) for k, v in FIELD.findall(line)}, **_reads(line)}
            for line in lines
            if " step " in line
        ]


def _lines(path: Path):
    """A step log's lines, gzipped or not."""
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def _reads(line: str) -> dict:
    """How the step's passes read their rows' recurrent state (`reads=`: logs since 2026-12-05's night)."""
    found = READS.search(line)
    return {"reads": found.group(1)} if found else {}


def decode_summary(steps: list[dict[str, float]]) -> dict[int, dict[str, float]]:
    """Per count of rows decoding, the decode-only steps (no prompt chunk) in medians: the step's ms
    and phases, and `outside`, the ms from the step before's end to this step's start."""
    by_rows: dict[int, list[dict[str, float]]] = {}
    for before, step in itertools.pairwise(steps):
        if step.get("prefill", 0) == 0 and step.get("decoding", 0) > 0:
            outside = (step["at"] - before["at"]) * 1000 - step["total"]
            by_rows.setdefault(int(step["decoding"]), []).append({**step, "outside": outside})
    return {
        rows: {
            "steps": len(group),
            **{k: statistics.median(s.get(k, 0.0) for s in group) for k in PHASES},
        }
        for rows, group in sorted(by_rows.items())
    }


def summary(steps: list[dict[str, float]], rows: int) -> dict:
    beside = [s for s in steps if s.get("decoding") == rows]
    chunks = [s for s in beside if s.get("prefill", 0) > 0]
    decode = [s["total"] for s in beside if s.get("prefill", 0) == 0]
    third = len(chunks) // 3
    parts = [chunks[:third], chunks[third : 2 * third], chunks[2 * third :]] if third else [chunks]

    def median(part: list[dict[str, float]], key: str) -> float:
        return statistics.median(s.get(key, 0.0) for s in part) if part else 0.0

    return {
        "chunk_steps": len(chunks),
        "thirds": [{k: median(p, k) for k in ("total", "build", "launch", "wait")} for p in parts],
        "slowest_ms": max((s["total"] for s in chunks), default=0.0),
        "decode_median_ms": statistics.median(decode) if decode else 0.0,
    }


def slowest(steps: list[dict], rows: int, count: int) -> list[tuple[int, dict]]:
    """The `count` slowest steps with `rows` rows decoding (or `rows` + 1: the long prompt's row joined),
    by their number in the log (1-based), slowest first."""
    numbered = [(i, s) for i, s in enumerate(steps, 1) if s.get("decoding") in (rows, rows + 1)]
    return sorted(numbered, key=lambda pair: -pair[1]["total"])[:count]


def slow_line(number: int, step: dict) -> str:
    extra = "".join(f", {key} {step[key]:.1f}" for key in ("cpu_launch", "gc", "launched_mb") if key in step)
    extra += f", reads {step['reads']}" if "reads" in step else ""
    return (
        f"  step {number}: {step['total']:.1f} ms, prefill {step.get('prefill', 0):.0f}, decoding "
        f"{step.get('decoding', 0):.0f}, launch {step.get('launch', 0):.1f}{extra}"
    )


def line(name: str, cells: dict) -> str:
    def by_third(key: str) -> str:
        return " / ".join(f"{t[key]:.1f}" for t in cells["thirds"])

    return (
        f"{name}: {cells['chunk_steps']} chunk steps, ms by third {by_third('total')} (build "
        f"{by_third('build')}, launch {by_third('launch')}, wait {by_third('wait')}), slowest "
        f"{cells['slowest_ms']:.1f}, decode-only median {cells['decode_median_ms']:.1f}"
    )


def recorded_steps(path: Path) -> list[dict]:
    """The steps a log recorded kernel by kernel: each one's header line, its instantiations and the
    kernels of every graph it launched, in order (runs like "copy_v x2" spelled out)."""
    steps: list[dict] = []
    with _lines(path) as lines:
        for line in lines:
            if line.startswith("step "):
                made = re.search(r"instantiate (\d+) x", line)
                new = int(made.group(1)) if made else 0
                steps.append({"header": line.split(":")[0], "new": new, "kernels": []})
            elif steps and re.match(r"  graph \d+: ", line):
                steps[-1]["kernels"].extend(_spelled(line.split(": ", 1)[1].strip()))
    return steps


NAME_CAP = 120  # kernel_times.NAME_CAP: logs written before a cut name was closed again leave a "<" open


def _spelled(runs: str) -> list[str]:
    """ "a<int, 4> x2, b" -> [a<int, 4>, a<int, 4>, b] (kernel_times.runs, read back: the runs split
    at the commas outside a name's template arguments)."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(runs):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and (depth == 0 or len(runs[start:i].strip()) >= NAME_CAP):
            depth = 0
            pieces.append(runs[start:i].strip())
            start = i + 1
    pieces.append(runs[start:].strip())
    names: list[str] = []
    for run in filter(None, pieces):
        name, times = re.fullmatch(r"(.*?)(?: x(\d+))?", run).groups()
        names.extend([name] * int(times or 1))
    return names


def graph_diffs(steps: list[dict]) -> list[str]:
    """Each step with new graphs against the next recorded step: the kernels one of them ran more often,
    by name (a pass's order shifts around an inserted kernel, its counts do not)."""
    out: list[str] = []
    for step, after in itertools.pairwise(steps):
        if not step["new"]:
            continue
        out.append(
            f"{step['header']} ({step['new']} new graphs, {len(step['kernels'])} kernels) against "
            f"{after['header']} ({len(after['kernels'])} kernels):"
        )
        here, there = Counter(step["kernels"]), Counter(after["kernels"])
        out.extend(f"  only here: {name} x{n}" for name, n in (here - there).items())
        out.extend(f"  only next: {name} x{n}" for name, n in (there - here).items())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--rows", type=int, default=16, help="the streaming rows beside the long prompt")
    parser.add_argument("--decode", action="store_true", help="decode-only steps by rows decoding")
    parser.add_argument("--slowest", type=int, default=6, help="the slowest steps listed, one a line")
    parser.add_argument("--diff-graphs", action="store_true", help="new CUDA graphs against the next step")
    args = parser.parse_args()
    for path in args.logs:
        if args.diff_graphs:
            print("\n".join(graph_diffs(recorded_steps(path))))
            continue
        if args.decode:
            for rows, cells in decode_summary(read_steps(path)).items():
                ms = ", ".join(f"{k} {cells[k]:.2f}" for k in PHASES)
                print(f"{path.name}: {rows} rows, {cells['steps']} steps, median ms: {ms}")
            continue
        steps = read_steps(path)
        print(line(path.name, summary(steps, args.rows)))
        for number, step in slowest(steps, args.rows, args.slowest):
            print(slow_line(number, step))


if __name__ == "__main__":
    main()
