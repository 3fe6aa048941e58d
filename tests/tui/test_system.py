"""Process, machine and GPU memory for the gauges."""

from __future__ import annotations

import shutil
from dataclasses import replace

import psutil
import pytest

from kinfer.tui.sample import GpuMemory
from kinfer.tui.system import GpuProbe, parse_nvidia_smi, read_system
from kinfer.tui.widgets.gauges import memory_line
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
