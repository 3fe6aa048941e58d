"""Every CUDA kernel a window of steps ran, with its device time, through CUPTI (torch's profiler).

    with KernelTimes() as kernels:
        ...                       # MLX work: its kernels, copies and memsets are recorded
    print(kernels.table())        # by kernel: calls, total ms, mean us, share of the busy time;
                                  # the host's CUDA calls; each CUDA graph instantiated, by its kernels

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
# the host side: CUDA runtime and driver calls (graph instantiations and updates, launches, captures)
_API_CATEGORIES = ("cuda_runtime", "cuda_driver")


NAME_CAP = 120  # a kernel name's characters kept (cuBLAS's run to hundreds)


def short_name(name: str) -> str:
    """A kernel's name without its parameter list (template arguments kept: cuBLAS's tile is in them)."""
    depth = 0
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i:
            name = name[:i]
            break
    name = name.removeprefix("void ").strip()
    if len(name) <= NAME_CAP:
        return name
    cut = name[:NAME_CAP]  # closed again, so that a list of names still splits at its commas
    return cut + "…" + ">" * max(0, cut.count("<") - cut.count(">"))


class KernelTimes:
    def __init__(self, marks: bool = False) -> None:
        self.with_marks = marks  # also record the host's ranges (record_function): torch's CPU activity
        self.events: list[dict] = []
        self.api_calls: list[dict] = []
        self.marks: list[dict] = []  # torch.profiler.record_function ranges (a caller's steps)

    def __enter__(self) -> KernelTimes:
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.init()  # the primary context MLX uses too
        cpu = [ProfilerActivity.CPU] if self.with_marks else []  # marks are CPU events to torch
        self._profile = profile(activities=[ProfilerActivity.CUDA, *cpu])
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            self._profile.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        timed = [
            {
                "name": e["name"],
                "cat": e.get("cat"),
                "ts": e["ts"],
                "dur": e.get("dur", 0),
                "tid": e.get("tid"),
                "correlation": (e.get("args") or {}).get("correlation"),
            }
            for e in trace.get("traceEvents", [])
            if e.get("ph") == "X"
        ]
        self.events = sorted((e for e in timed if e["cat"] in _DEVICE_CATEGORIES), key=lambda e: e["ts"])
        self.api_calls = [e for e in timed if e["cat"] in _API_CATEGORIES]
        self.marks = sorted((e for e in timed if e["cat"] == "user_annotation"), key=lambda e: e["ts"])

    def within(self, mark: dict) -> KernelTimes:
        """The host calls, and the kernels they launched, inside one marked range (a step)."""
        start, stop = mark["ts"], mark["ts"] + mark["dur"]
        part = KernelTimes()
        part.api_calls = [e for e in self.api_calls if start <= e["ts"] <= stop]
        launched = {e["correlation"] for e in part.api_calls if e.get("correlation") is not None}
        part.events = [e for e in self.events if e.get("correlation") in launched]
        return part

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
        return _summed(self.events, "kernel", short_name)

    def by_api_call(self) -> list[dict]:
        """The host's CUDA calls by name: calls, total and mean host time (cudaGraphInstantiate's share
        says how often MLX met a CUDA graph it had no executable for)."""
        return _summed(self.api_calls, "call", lambda name: name)

    def new_graphs(self) -> list[dict]:
        """The CUDA graphs instantiated in the window, each as the kernels it ran: an instantiation is
        followed by the launch of its executable on the same thread (MLX, CommandEncoder::commit), and
        CUPTI gives a graph's kernels the correlation id of that launch. What a pass's new topology
        holds (a cuBLAS variant, an extra gather) shows which op brought it."""
        kernels: dict[object, list[dict]] = defaultdict(list)
        for e in self.events:  # in time order
            if e.get("correlation") is not None:  # kernels, and a graph's memsets and copies
                kernels[e["correlation"]].append(e)
        start = self.events[0]["ts"] if self.events else 0.0
        found: list[dict] = []
        waiting: dict[object, list[dict]] = defaultdict(list)  # per thread: instantiated, not yet launched
        for call in sorted(self.api_calls, key=lambda e: e["ts"]):
            if call["name"] == "cudaGraphInstantiate":
                graph = {"at_ms": (call["ts"] - start) / 1000, "instantiate_us": call["dur"], "kernels": []}
                found.append(graph)
                waiting[call.get("tid")].append(graph)
            elif call["name"] == "cudaGraphLaunch":
                ran = kernels.get(call.get("correlation"), [])
                for graph in waiting.pop(call.get("tid"), []):
                    graph["kernels"] = [short_name(k["name"]) for k in ran]
        return found

    def launched_graphs(self) -> list[int]:
        """Each CUDA graph launch's kernel count (its memsets and copies too), in launch order: the
        shape of a step's passes as MLX cut them into graphs, to set a new one beside its neighbours."""
        return [len(kernels) for kernels in self.launched_kernels()]

    def launched_kernels(self) -> list[list[str]]:
        """Each CUDA graph launch's kernels by name, in launch order and, within a graph, time order: a
        step's new graphs set beside the next step's updated ones show what made them new
        (read_step_log.py --diff-graphs)."""
        kernels: dict[object, list[str]] = defaultdict(list)
        for e in self.events:  # in time order
            if e.get("correlation") is not None:
                kernels[e["correlation"]].append(short_name(e["name"]))
        launches = [c for c in self.api_calls if c["name"] == "cudaGraphLaunch"]
        launches.sort(key=lambda e: e["ts"])
        return [kernels.get(c.get("correlation"), []) for c in launches]

    def table(self, top: int = 25) -> str:
        busy = self.busy_us() / 1000
        first, last = (self.events[0], self.events[-1]) if self.events else ({"ts": 0}, {"ts": 0, "dur": 0})
        span = (last["ts"] + last["dur"] - first["ts"]) / 1000
        lines = [f"{len(self.events)} device events, busy {busy:.2f} ms of a {span:.2f} ms span"]
        for r in self.by_kernel()[:top]:
            share = 100 * r["total_ms"] / busy if busy else 0
            calls = f"{r['calls']:6d} x {r['mean_us']:9.1f} us"
            lines.append(f"{r['total_ms']:9.3f} ms {share:5.1f} % {calls}  {r['kernel']}")
        if self.api_calls:
            lines.append(f"host CUDA calls: {len(self.api_calls)}")
            for r in self.by_api_call()[:12]:
                lines.append(f"{r['total_ms']:9.3f} ms {r['calls']:6d} x {r['mean_us']:9.1f} us  {r['call']}")
        for graph in self.new_graphs():
            lines.append(
                f"new graph at {graph['at_ms']:.2f} ms ({graph['instantiate_us']:.0f} us): "
                f"{len(graph['kernels'])} kernels: {runs(graph['kernels'])[:400]}"
            )
        return "\n".join(lines)

    def summary(self) -> dict:
        return {
            "busy_ms": self.busy_us() / 1000,
            "events": len(self.events),
            "kernels": self.by_kernel(),
            "api_calls": self.by_api_call(),
            "new_graphs": self.new_graphs(),
        }


def _summed(events: list[dict], label: str, name_of) -> list[dict]:
    """Events grouped by name: calls, total ms and mean us each, the largest total first."""
    groups: dict[str, list[float]] = defaultdict(list)
    for e in events:
        groups[name_of(e["name"])].append(e["dur"])
    rows = [
        {label: name, "calls": len(d), "total_ms": sum(d) / 1000, "mean_us": sum(d) / len(d)}
        for name, d in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])


def runs(names: list[str]) -> str:
    """Kernel names in order, repeats joined ("a x3, b"), MLX's namespace dropped."""
    out: list[list] = []
    for name in names:
        name = name.removeprefix("mlx::core::cu::")
        if out and out[-1][0] == name:
            out[-1][1] += 1
        else:
            out.append([name, 1])
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in out)
