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
