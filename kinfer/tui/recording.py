"""Recorded metrics: replay `DashboardSample`s instead of a live scheduler, for deterministic screens.

    recorder = Recorder(LiveSource(runtime.scheduler, runtime.requests))  # keeps what it hands out
    ...                                                  # the dashboard (or a loop) calls it
    save_recording(recorder.samples, path)               # JSON, one object per sample
    app = KinferDashboard(source=RecordedSource(load_recording(path)), ...)

A `RecordedSource` hands out its samples in order and then repeats the last one, so however many
ticks a test runs past the end, the screen stays the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kinfer.engines.base import EngineStats
from kinfer.scheduler import RequestSnapshot, SchedulerSnapshot
from kinfer.scheduler.scheduler import ModelSnapshot
from kinfer.tui.sample import DashboardSample, GpuMemory, LogEntry, SampleSource, SystemSample

RECORDING_VERSION = 1


class RecordedSource:
    """A `SampleSource` that replays samples; past the end it keeps returning the last one."""

    def __init__(self, samples: Sequence[DashboardSample]) -> None:
        if not samples:
            raise ValueError("a recording needs at least one sample")
        self.samples = tuple(samples)
        self.position = 0

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.samples)

    def __call__(self) -> DashboardSample:
        if self.exhausted:
            last = self.samples[-1]
            # finished requests are logged once, not on every repeat
            return DashboardSample(scheduler=last.scheduler, system=last.system)
        sample = self.samples[self.position]
        self.position += 1
        return sample


class Recorder:
    """Wraps a live source and keeps every sample it returns."""

    def __init__(self, source: SampleSource) -> None:
        self.source = source
        self.samples: list[DashboardSample] = []

    def open(self) -> None:
        self.source.open()

    def close(self) -> None:
        self.source.close()

    def __call__(self) -> DashboardSample:
        sample = self.source()
        self.samples.append(sample)
        return sample


# ---- JSON ---------------------------------------------------------------------------------------


def sample_to_dict(sample: DashboardSample) -> dict[str, Any]:
    return asdict(sample)


def sample_from_dict(data: dict[str, Any]) -> DashboardSample:
    sched = data["scheduler"]
    models = tuple(
        ModelSnapshot(
            **{**model, "stats": EngineStats(**model["stats"]), "names": tuple(model.get("names", ()))}
        )
        for model in sched["models"]
    )
    scheduler = SchedulerSnapshot(
        **{
            **sched,
            "models": models,
            "requests": tuple(RequestSnapshot(**r) for r in sched["requests"]),
        }
    )
    system = data["system"]
    return DashboardSample(
        scheduler=scheduler,
        system=SystemSample(**{**system, "gpus": tuple(GpuMemory(**g) for g in system.get("gpus", ()))}),
        finished=tuple(LogEntry(**entry) for entry in data.get("finished", ())),
    )


def save_recording(samples: Sequence[DashboardSample], path: Path) -> None:
    """JSON with one sample per line, so a re-recorded file diffs line by line."""
    lines = ",\n".join(json.dumps(sample_to_dict(s), separators=(",", ":")) for s in samples)
    text = f'{{"version": {RECORDING_VERSION}, "samples": [\n{lines}\n]}}\n'
    Path(path).write_text(text, encoding="utf-8")


def load_recording(path: Path) -> list[DashboardSample]:
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    if document.get("version") != RECORDING_VERSION:
        raise ValueError(f"{path}: recording version {document.get('version')}, expected {RECORDING_VERSION}")
    return [sample_from_dict(s) for s in document["samples"]]
