"""A stall run's step log in a few numbers: the long prompt's chunk steps by thirds, its slowest steps.

    python scripts/read_step_log.py steps-NAME.log.gz [...] [--rows 16]

Reads logs written by scripts/step_log (`KINFER_STEP_HOOK`, every step with `KINFER_STEP_SLOW=0`), as
`scripts/bench_stalls.py` runs keep them beside their JSON. Of the steps with `--rows` rows decoding, the
ones that also prefilled (the long prompt's chunks) are cut into thirds in order; per third the median
step ms and its phases (build, launch, wait), then the slowest chunk step and the median of the
decode-only steps. One line per log.
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
from pathlib import Path

FIELD = re.compile(r"(\w+)=([\d.]+)")


def read_steps(path: Path) -> list[dict[str, float]]:
    """Each logged step's numeric fields (prefill, decoding, build, launch, wait, other, total)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        return [{k: float(v) for k, v in FIELD.findall(line)} for line in lines if " step " in line]


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


def line(name: str, cells: dict) -> str:
    def by_third(key: str) -> str:
        return " / ".join(f"{t[key]:.1f}" for t in cells["thirds"])

    return (
        f"{name}: {cells['chunk_steps']} chunk steps, ms by third {by_third('total')} (build "
        f"{by_third('build')}, launch {by_third('launch')}, wait {by_third('wait')}), slowest "
        f"{cells['slowest_ms']:.1f}, decode-only median {cells['decode_median_ms']:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--rows", type=int, default=16, help="the streaming rows beside the long prompt")
    args = parser.parse_args()
    for path in args.logs:
        print(line(path.name, summary(read_steps(path), args.rows)))


if __name__ == "__main__":
    main()
