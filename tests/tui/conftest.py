"""Fixtures for the dashboard: a store with models, recorded samples, and SVG snapshots in snapshots/.

pytest-textual-snapshot keeps its SVGs next to the test file (`__snapshots__/`); it has no option
for another folder, so the `snapshot` fixture below hands `snap_compare` an extension that writes to
the repository's top-level `snapshots/<test module>/` instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pytest_textual_snapshot import SVGImageExtension

from kinfer.store.catalog import Store
from kinfer.tui.app import KinferDashboard
from kinfer.tui.recording import RecordedSource, load_recording
from kinfer.tui.sample import DashboardSample
from tests.fixtures.tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "snapshots"
RECORDINGS = Path(__file__).resolve().parent / "recordings"
IDLE_AT = 1_795_984_000.0  # a fixed wall-clock time for hand-made samples


class TopLevelSVGExtension(SVGImageExtension):
    """SVG snapshots under `snapshots/<test module>/<test name>.svg`."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(SNAPSHOTS / test_location.basename)


class _SnapshotsAtTop:
    """What `snap_compare` needs of syrupy's `snapshot`: `use_extension`, redirected."""

    def __init__(self, snapshot) -> None:
        self._snapshot = snapshot

    def use_extension(self, _extension=None):
        return self._snapshot.use_extension(TopLevelSVGExtension)


@pytest.fixture
def snapshot(snapshot):
    return _SnapshotsAtTop(snapshot)


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    """Clock strings in UTC, so a snapshot reads the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def store(kinfer_home: Path) -> Store:
    """The bundled SmolLM2 plus two tiny GGUF files dropped into models/ (no Ollama store)."""
    for index, (name, quant) in enumerate((("tiny-chat", "F32"), ("tiny-q8", "Q8_0"))):
        (path,) = write_tiny_gguf(kinfer_home / "models" / f"{name}.gguf", name=name, quant=quant)
        # fixed times: the newest pulled model is the default, and snapshots must not depend on a race
        os.utime(path, (IDLE_AT - 3600 + index, IDLE_AT - 3600 + index))
    return Store(kinfer_home, ollama_models=None)


@pytest.fixture(scope="session")
def burst() -> list[DashboardSample]:
    """Samples recorded while the real SmolLM2 answered six requests (see record_burst.py)."""
    return load_recording(RECORDINGS / "burst.json")


def recorded_app(samples: list[DashboardSample], store: Store | None = None) -> KinferDashboard:
    """A dashboard that only moves when the test calls `tick()`: nothing depends on wall time."""
    return KinferDashboard(
        source=RecordedSource(samples),
        store=store,
        url="http://127.0.0.1:11500",
        refresh_interval=None,
        store_interval=None,
    )


def idle_sample(taken_at: float = IDLE_AT) -> DashboardSample:
    """A server with nothing loaded and nothing asked yet."""
    from kinfer.scheduler import SchedulerSnapshot
    from kinfer.tui.sample import SystemSample

    return DashboardSample(
        scheduler=SchedulerSnapshot(
            taken_at=taken_at,
            models=(),
            requests=(),
            queue_depth=0,
            outcomes={},
            prompt_tokens_total=0,
            generated_tokens_total=0,
            reused_tokens_total=0,
        ),
        system=SystemSample(rss=182_452_224, memory_used=6_442_450_944, memory_total=16_777_216_000),
    )


async def workers_settled(app) -> None:
    """Wait until the app's workers have finished. A store listing restarted (after a pull ends, or a
    delete) cancels the one still running, and `wait_for_complete` raises WorkerCancelled for it: that
    one is done too, so wait again for the rest (bounded)."""
    from textual.worker import WorkerCancelled

    for _ in range(20):
        try:
            await app.workers.wait_for_complete()
            return
        except WorkerCancelled:
            continue
