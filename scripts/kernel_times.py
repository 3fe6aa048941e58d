"""Every CUDA kernel a window of steps ran, with its device time, through CUPTI (torch's profiler).

    with KernelTimes() as kernels:
        ...                       # MLX work: its kernels, copies and memsets are recorded
    print(kernels.table())        # by kernel: calls, total ms, mean us, share of the busy time

MLX has no kernel timer of its own on CUDA and the H200 machine has no `nsys`; `ncu` replays each
kernel. CUPTI's activity records need no performance-counter rights and see every kernel of the
process, whichever library launched it (MLX launches its kernels inside CUDA graphs: CUPTI reports
each node). torch is on the H200 machine, not in kinfer's dependencies: this is a probe's helper.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path

_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def short_name(name: str) -> str:
    """A kernel's name without its parameter list (template arguments kept: cuBLAS's tile is in them)."""
    depth = 0
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i:
            name = name[:i]
            break
    return name.removeprefix("void ").strip()[:120]


class KernelTimes:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def __enter__(self) -> KernelTimes:
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.init()  # the primary context MLX uses too
        self._profile = profile(activities=[ProfilerActivity.CUDA])
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            self._profile.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        self.events = [
            {"name": e["name"], "cat": e["cat"], "ts": e["ts"], "dur": e.get("dur", 0)}
            for e in trace.get("traceEvents", [])
            if e.get("cat") in _DEVICE_CATEGORIES and e.get("ph") == "X"
        ]
        self.events.sort(key=lambda e: e["ts"])

    def busy_us(self) -> float:
        """Device time with at least one kernel or copy running (overlaps counted once)."""
        busy, end = 0.0, float("-inf")
        for e in self.events:
            start, stop = e["ts"], e["ts"] + e["dur"]
            if stop > end:
                busy += stop - max(start, end)
                end = stop
        return busy

    def by_kernel(self) -> list[dict]:
        groups: dict[str, list[float]] = defaultdict(list)
        for e in self.events:
            groups[short_name(e["name"])].append(e["dur"])
        rows = [
            {"kernel": name, "calls": len(d), "total_ms": sum(d) / 1000, "mean_us": sum(d) / len(d)}
            for name, d in groups.items()
        ]
        return sorted(rows, key=lambda r: -r["total_ms"])

    def table(self, top: int = 25) -> str:
        busy = self.busy_us() / 1000
        first, last = (self.events[0], self.events[-1]) if self.events else ({"ts": 0}, {"ts": 0, "dur": 0})
        span = (last["ts"] + last["dur"] - first["ts"]) / 1000
        lines = [f"{len(self.events)} device events, busy {busy:.2f} ms of a {span:.2f} ms span"]
        for r in self.by_kernel()[:top]:
            share = 100 * r["total_ms"] / busy if busy else 0
            calls = f"{r['calls']:6d} x {r['mean_us']:9.1f} us"
            lines.append(f"{r['total_ms']:9.3f} ms {share:5.1f} % {calls}  {r['kernel']}")
        return "\n".join(lines)

    def summary(self) -> dict:
        return {"busy_ms": self.busy_us() / 1000, "events": len(self.events), "kernels": self.by_kernel()}
