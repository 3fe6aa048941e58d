"""scripts/kernel_times.py (every CUDA kernel of a window, through CUPTI) and the window profile_steps.py
opens over a run of steps. CUPTI itself runs only on the H200 machine: here the events are given."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.bench.test_profile_scripts import SCRIPTS, _load
from tests.engines.mlx.fixtures import *  # noqa: F403


@pytest.fixture
def kernel_times(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # profile_steps imports it as its sibling
    return _load("kernel_times")


def _event(name: str, ts: float, dur: float) -> dict:
    return {"name": name, "cat": "kernel", "ts": ts, "dur": dur}


def test_a_kernel_is_named_without_its_parameters_but_with_its_template(kernel_times):
    short = kernel_times.short_name
    assert (
        short("void mlx::core::cu::gather<float, int, 2>(const float*, int)")
        == "mlx::core::cu::gather<float, int, 2>"
    )
    assert (
        short("void cutlass::Kernel2<gemm_bf16_128x2_tn>(Params)") == "cutlass::Kernel2<gemm_bf16_128x2_tn>"
    )
    assert short("cudnn_generated_sdpa_kernel0_0") == "cudnn_generated_sdpa_kernel0_0"
    long = "void cublasLt::splitKreduce_kernel<32, 16, " + "float, " * 40 + "int>(Params)"
    cut = short(long)  # cut at the cap, its brackets closed: a list of names still splits at commas
    assert cut.startswith("cublasLt::splitKreduce_kernel<32, 16, float")
    assert cut.endswith("…>") and len(cut) == kernel_times.NAME_CAP + 2


def test_busy_time_counts_overlapping_kernels_once_and_kernels_are_summed_by_name(kernel_times):
    times = kernel_times.KernelTimes()
    times.events = [
        _event("void a<1>(int)", 0, 10),
        _event("void a<1>(float)", 5, 10),  # overlaps the first: busy 0-15
        _event("void b(int)", 20, 4),  # an idle gap of 5 before it
    ]
    assert times.busy_us() == 19
    rows = times.by_kernel()
    assert [(r["kernel"], r["calls"], r["total_ms"]) for r in rows] == [("a<1>", 2, 0.02), ("b", 1, 0.004)]
    assert rows[0]["mean_us"] == 10
    table = times.table()
    assert table.splitlines()[0] == "3 device events, busy 0.02 ms of a 0.02 ms span"
    assert "a<1>" in table.splitlines()[1]


def test_the_hosts_cuda_calls_are_summed_by_name_apart_from_the_device_time(kernel_times):
    times = kernel_times.KernelTimes()
    times.events = [_event("void a(int)", 0, 10)]
    times.api_calls = [
        {"name": "cudaGraphInstantiate", "cat": "cuda_runtime", "ts": 0, "dur": 900},
        {"name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 1, "dur": 20},
        {"name": "cudaGraphInstantiate", "cat": "cuda_runtime", "ts": 2, "dur": 1100},
    ]
    assert times.busy_us() == 10  # host calls are not device time
    rows = times.by_api_call()
    assert [(r["call"], r["calls"], r["total_ms"], r["mean_us"]) for r in rows] == [
        ("cudaGraphInstantiate", 2, 2.0, 1000),
        ("cudaGraphLaunch", 1, 0.02, 20),
    ]
    assert "2 x    1000.0 us  cudaGraphInstantiate" in times.table()
    assert times.summary()["api_calls"] == rows


def test_a_new_graph_is_named_by_the_kernels_its_first_launch_ran(kernel_times):
    times = kernel_times.KernelTimes()

    def call(name: str, ts: float, tid: int, correlation: int) -> dict:
        return {
            "name": name,
            "cat": "cuda_runtime",
            "ts": ts,
            "dur": 1700,
            "tid": tid,
            "correlation": correlation,
        }

    def kernel(name: str, ts: float, correlation: int) -> dict:
        return {"name": name, "cat": "kernel", "ts": ts, "dur": 5, "correlation": correlation}

    times.api_calls = [
        call("cudaGraphLaunch", 0, 1, 10),  # an executable met before: updated, not new
        call("cudaGraphInstantiate", 100, 1, 11),
        call("cudaGraphLaunch", 2000, 2, 12),  # another thread's launch: not this graph's
        call("cudaGraphLaunch", 2100, 1, 13),  # the new executable's launch
    ]
    times.events = [
        kernel("void mlx::core::cu::rope<bf16>(int)", 10, 10),
        kernel("void mlx::core::cu::gather<bf16, 2>(int)", 2200, 12),
        kernel("void mlx::core::cu::rms_norm<bf16>(int)", 2150, 13),
        kernel("void nvjet_splitK_TNT(int)", 2160, 13),
        kernel("void nvjet_splitK_TNT(int)", 2170, 13),
    ]
    [graph] = times.new_graphs()
    assert graph["kernels"] == ["mlx::core::cu::rms_norm<bf16>", "nvjet_splitK_TNT", "nvjet_splitK_TNT"]
    assert graph["instantiate_us"] == 1700 and graph["at_ms"] == 0.09
    assert "new graph at 0.09 ms (1700 us): 3 kernels: rms_norm<bf16>, nvjet_splitK_TNT x2" in times.table()
    assert times.summary()["new_graphs"] == [graph]


def test_the_window_records_exactly_its_steps_from_where_it_begins(kernel_times, monkeypatch):
    opened = []

    class FakeTimes:
        def __init__(self, marks: bool = False) -> None:
            self.marks = marks

        def __enter__(self):
            opened.append(self)
            self.closed = False
            return self

        def __exit__(self, *exc):
            self.closed = True

        def table(self):
            return "table"

        def summary(self):
            return {"busy_ms": 1.0}

    monkeypatch.setitem(sys.modules, "kernel_times", SimpleNamespace(KernelTimes=FakeTimes))
    monkeypatch.setitem(sys.modules, "mlx.core", SimpleNamespace(synchronize=lambda: None))
    import mlx

    monkeypatch.setattr(mlx, "core", sys.modules["mlx.core"], raising=False)
    window = _load("profile_steps").KernelWindow(2)
    log: list[dict] = []
    for i in range(5):
        if i >= 1:
            window.begin()  # asked every step once the condition holds: opens once, records 2 steps
        log.append({"ms": float(i)})
        window.after_step(log)
    assert len(opened) == 1 and opened[0].closed
    assert [s.get("kernels", False) for s in log] == [False, True, True, False, False]
    assert window.result(log)["kernels"] == {"busy_ms": 1.0, "steps": 2, "step_ms": [1.0, 2.0]}
    assert opened[0].marks is False  # a window read whole needs no host ranges


def test_a_steps_calls_are_the_ones_inside_its_mark_and_the_kernels_they_launched(kernel_times):
    times = kernel_times.KernelTimes()
    times.api_calls = [
        {"name": "cudaGraphInstantiate", "ts": 10, "dur": 2000, "tid": 1, "correlation": None},
        {"name": "cudaGraphLaunch", "ts": 2100, "dur": 50, "tid": 1, "correlation": 7},
        {"name": "cudaGraphLaunch", "ts": 9000, "dur": 50, "tid": 1, "correlation": 8},
    ]
    times.events = [
        {"name": "void a(int)", "cat": "kernel", "ts": 2200, "dur": 5, "correlation": 7},
        {"name": "Memset (Device)", "cat": "gpu_memset", "ts": 2210, "dur": 1, "correlation": 7},
        {"name": "void b(int)", "cat": "kernel", "ts": 9100, "dur": 5, "correlation": 8},
    ]
    first, second = times.within({"ts": 0, "dur": 5000}), times.within({"ts": 8000, "dur": 2000})
    [graph] = first.new_graphs()
    assert graph["kernels"] == ["a", "Memset"]  # a graph's memsets are part of its topology
    assert first.launched_graphs() == [2] and times.launched_graphs() == [2, 1]  # by launch, in order
    assert times.launched_kernels() == [["a", "Memset"], ["b"]]
    assert [c["call"] for c in second.by_api_call()] == ["cudaGraphLaunch"] and not second.new_graphs()
    assert [e["name"] for e in second.events] == ["void b(int)"]


def test_a_per_step_window_marks_each_step_and_prints_a_line_each(kernel_times, monkeypatch, capsys):
    class FakeTimes:
        def __init__(self, marks: bool = False) -> None:
            self.with_marks = marks
            self.marks = [{"ts": 0, "dur": 10}, {"ts": 10, "dur": 10}]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def within(self, mark):
            instantiated = [{"call": "cudaGraphInstantiate", "calls": 1, "total_ms": 2.0, "mean_us": 2000}]
            return SimpleNamespace(
                by_api_call=lambda: instantiated if mark["ts"] == 10 else [],
                new_graphs=lambda: [{"instantiate_us": 2000, "kernels": ["a", "a"]}] if mark["ts"] else [],
                launched_graphs=lambda: [2, 100] if mark["ts"] else [100],
                launched_kernels=lambda: [["a", "a"], ["b"] * 100] if mark["ts"] else [["b"] * 100],
            )

    monkeypatch.setitem(
        sys.modules, "kernel_times", SimpleNamespace(KernelTimes=FakeTimes, runs=lambda k: "a x2")
    )
    monkeypatch.setitem(sys.modules, "mlx.core", SimpleNamespace(synchronize=lambda: None))
    import mlx

    monkeypatch.setattr(mlx, "core", sys.modules["mlx.core"], raising=False)
    window = _load("profile_steps").KernelWindow(2, per_step=True)
    window.begin()
    assert window.open.with_marks  # the host's ranges are recorded: torch's CPU activity
    log: list[dict] = []
    for i in range(2):
        log.append({"ms": float(i), "prefill": 128, "fed": 256 * i})
        window.after_step(log)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 0.0 ms prefill 128 fed 0: instantiate 0,")
    assert lines[1] == "  graphs launched (kernels each): [100]"
    assert lines[2] == "  graph 0: a x2"  # every launched graph whole (runs faked: "a x2")
    assert lines[3].startswith("step 1.0 ms prefill 128 fed 256: instantiate 1 x 2.00 ms,")
    assert lines[4] == "  graphs launched (kernels each): [2, 100]"
    assert lines[5:] == ["  new graph (2000 us) 2 kernels: a x2", "  graph 0: a x2", "  graph 1: a x2"]
    assert log[1]["kernel_step"]["new_graphs"][0]["kernels"] == 2


def test_the_engine_bench_reads_the_devices_busy_time_over_decode_steps_only(
    tiny_qwen3, make_mlx, kernel_times, monkeypatch
):
    """bench_mlx_engine.py --breakdown's `gpu` column: CUPTI's window opens once every row decodes and
    holds exactly the steps it divides by; the engine is left with no work. (CUPTI faked: a CPU.)"""
    from kinfer.engines.mlx import kernels

    engine = make_mlx(tiny_qwen3, rows=2)
    stepped = []
    real_step = engine.step

    class FakeTimes:
        def __enter__(self):
            stepped.append("open")
            return self

        def __exit__(self, *exc):
            stepped.append("close")

        def busy_us(self):
            return 3200.0

    def step():
        updates = real_step()
        stepped.append("step")
        return updates

    monkeypatch.setattr(engine, "step", step)
    monkeypatch.setattr(kernels, "on_cuda_gpu", lambda: True)
    monkeypatch.setitem(sys.modules, "kernel_times", SimpleNamespace(KernelTimes=FakeTimes))
    bench = _load("bench_mlx_engine")
    assert bench.device_ms_per_step(engine, [[5, 6, 7], [8, 9]], steps=4) == 0.8
    inside = stepped[stepped.index("open") + 1 : stepped.index("close")]
    assert inside == ["step"] * 4 and stepped.index("open") >= 1  # the prompts' steps came before
    assert not engine.has_work
