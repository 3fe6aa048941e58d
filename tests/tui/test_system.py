"""Process, machine and GPU memory, and the engines' memory account, for the gauges."""

from __future__ import annotations

import shutil
from dataclasses import replace

import psutil
import pytest

from kinfer.engines.base import EngineStats
from kinfer.engines.memory_account import MemoryAccount
from kinfer.scheduler.records import ModelSnapshot
from kinfer.tui.sample import GpuMemory
from kinfer.tui.system import GpuProbe, parse_nvidia_smi, read_system
from kinfer.tui.widgets.gauges import engine_memory_line, memory_line
from tests.tui.conftest import idle_sample

MIB = 1024 * 1024
# what `nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader,nounits` printed
# on an idle H200; the second board and the [N/A] line are the shapes other machines print
H200 = "NVIDIA H200, 0, 143771\n"


def test_nvidia_smi_rows_become_bytes() -> None:
    assert parse_nvidia_smi(H200) == (GpuMemory("NVIDIA H200", 0, 143771 * MIB),)
    two = parse_nvidia_smi(H200 + "NVIDIA GeForce RTX 4090, 2048, 24564\nTesla K80, [N/A], [N/A]\n")
    assert [g.name for g in two] == ["NVIDIA H200", "NVIDIA GeForce RTX 4090"]
    assert two[1].used == 2048 * MIB


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA GPU")
def test_without_nvidia_smi_the_probe_stays_idle() -> None:
    probe = GpuProbe(interval=0.1)
    probe.start()
    probe.stop()
    assert probe.latest == ()


def test_read_system_reports_this_process_and_machine() -> None:
    sample = read_system(psutil.Process())
    assert 0 < sample.rss < sample.memory_total
    assert 0 < sample.memory_used <= sample.memory_total


def test_the_memory_gauge_shows_gpus_when_known() -> None:
    sample = idle_sample()
    plain = memory_line(sample).plain
    assert "GPU" not in plain
    with_gpu = replace(sample, system=replace(sample.system, gpus=parse_nvidia_smi(H200)))
    assert "GPU0 0 B/140 GiB" in memory_line(with_gpu).plain


def test_the_engine_gauge_shows_the_account_against_the_budget() -> None:
    account = MemoryAccount(weights=900 * MIB, kv=512 * MIB, state=64 * MIB, pool=32 * MIB, scratch=40 * MIB)
    memory = {
        **replace(account, cache=256 * MIB, total=1548 * MIB, budget=12 * 1024 * MIB).as_dict(),
        "peak": 1,
    }
    model = ModelSnapshot("qwen3.5", "mlx", 4, 2, 0, 4096, 1, None, EngineStats(memory=memory))
    sample = idle_sample()
    loaded = replace(sample, scheduler=replace(sample.scheduler, models=(model,)))

    assert engine_memory_line(sample).plain == "engine -"
    assert engine_memory_line(loaded).plain == (
        "engine 1.5 GiB of 12 GiB  weights 900 MiB  KV 512 MiB  state 64 MiB  pool 32 MiB  scratch 40 MiB"
        "  cache 256 MiB"
    )
