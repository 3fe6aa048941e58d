"""Process and machine memory (psutil), and GPU memory from `nvidia-smi` where there is one."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading

import psutil

from kinfer.tui.sample import GpuMemory, SystemSample

log = logging.getLogger(__name__)

GPU_POLL_S = 5.0  # nvidia-smi takes tens of milliseconds: far too slow for every tick
NVIDIA_SMI_QUERY = ("--query-gpu=name,memory.used,memory.total", "--format=csv,noheader,nounits")
MIB = 1024 * 1024


def parse_nvidia_smi(text: str) -> tuple[GpuMemory, ...]:
    """Rows of `nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        try:
            gpus.append(GpuMemory(parts[0], int(float(parts[1]) * MIB), int(float(parts[2]) * MIB)))
        except ValueError:
            continue  # "[N/A]" on some boards
    return tuple(gpus)


class GpuProbe:
    """Polls nvidia-smi on its own thread every few seconds; `latest` is what it last saw.

    Does nothing on machines without nvidia-smi (MLX reports Apple GPU memory through the engine).
    """

    def __init__(self, interval: float = GPU_POLL_S) -> None:
        self.interval = interval
        self.latest: tuple[GpuMemory, ...] = ()
        self._binary = shutil.which("nvidia-smi")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._binary is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kinfer-gpu-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    [self._binary, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=5, check=True
                ).stdout
                self.latest = parse_nvidia_smi(out)
            except (OSError, subprocess.SubprocessError) as exc:
                log.debug("nvidia-smi failed: %s; no GPU gauge", exc)
                self.latest = ()
                return
            self._stop.wait(self.interval)


def read_system(process: psutil.Process, gpus: tuple[GpuMemory, ...] = ()) -> SystemSample:
    """Cheap enough for every tick: one /proc read for the process, one for the machine."""
    memory = psutil.virtual_memory()
    return SystemSample(
        rss=process.memory_info().rss,
        memory_used=memory.total - memory.available,
        memory_total=memory.total,
        gpus=gpus,
    )
