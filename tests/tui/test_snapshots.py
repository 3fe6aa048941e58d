"""SVG snapshots of the dashboard, fed from recorded samples so every run draws the same screen.

Update them after a deliberate change with `pytest tests/tui/test_snapshots.py --snapshot-update`
and look at the SVGs in snapshots/test_snapshots/ before committing.
"""

from __future__ import annotations

from kinfer.store.progress import PullProgress
from kinfer.tui.sample import DashboardSample, LogEntry
from kinfer.tui.widgets.pull_panel import PullPanel
from tests.tui.conftest import idle_sample, recorded_app, workers_settled

MODEL_BYTES = 734_003_200
SHARD = MODEL_BYTES // 2


def replay_all(samples):
    """run_before: one tick per recorded sample (the app shows the first on mount)."""

    async def run(pilot) -> None:
        for _ in range(len(samples) - 1):
            pilot.app.tick()
        await workers_settled(pilot.app)  # the store listing
        await pilot.pause()
        assert pilot.app.tick_failures == 0

    return run


def test_idle_dashboard(snap_compare, store, utc) -> None:
    """Nothing loaded, nothing running: the store lists its three models, the gauges read zero."""
    samples = [idle_sample()]
    assert snap_compare(recorded_app(samples, store), terminal_size=(120, 36), run_before=replay_all(samples))


def test_dashboard_under_load(snap_compare, store, burst, utc) -> None:
    """Six requests on the real SmolLM2: four rows decoding, one queued one prefilling, two fading."""
    assert snap_compare(recorded_app(burst, store), terminal_size=(120, 36), run_before=replay_all(burst))


def test_dashboard_under_load_at_80x24(snap_compare, store, burst, utc) -> None:
    """The smallest terminal we support still shows every panel."""
    assert snap_compare(recorded_app(burst, store), terminal_size=(80, 24), run_before=replay_all(burst))


def test_request_pane_lists_every_request(snap_compare, store, utc) -> None:
    """Requests that generate nothing (a model list, a refusal) show their status, method and path."""
    first = idle_sample()
    at = first.taken_at
    entries = (
        LogEntry(at - 3, "", "ollama", "", 0, 0, "", 0.002, "GET", "/api/tags", 200),
        LogEntry(at - 2, "", "openai", "smollm2:135m", 0, 0, "", 0.001, "POST", "/v1/chat/completions", 400),
        LogEntry(
            at - 1,
            "chatcmpl-1",
            "openai",
            "smollm2:135m",
            45,
            20,
            "stop",
            1.2,
            "POST",
            "/v1/chat/completions",
            200,
        ),
    )
    samples = [first, DashboardSample(scheduler=first.scheduler, system=first.system, finished=entries)]
    assert snap_compare(recorded_app(samples, store), terminal_size=(120, 36), run_before=replay_all(samples))


def test_dashboard_during_a_pull(snap_compare, store, utc) -> None:
    """A two-shard pull half way: the model's bar, bytes, rate and ETA, and one line per file."""
    samples = [idle_sample()]
    events = [
        (0.0, PullProgress("pulling manifest", "resolving")),
        (0.5, _downloading("model-00001-of-00002.safetensors", SHARD, SHARD, SHARD)),
        (0.6, _downloading("model-00002-of-00002.safetensors", 0, SHARD, SHARD)),
        (4.0, _downloading("model-00002-of-00002.safetensors", 52_428_800, SHARD, SHARD + 52_428_800)),
        (6.0, _downloading("model-00002-of-00002.safetensors", 83_886_080, SHARD, SHARD + 83_886_080)),
    ]

    async def run(pilot) -> None:
        await replay_all(samples)(pilot)
        panel = pilot.app.query_one(PullPanel)
        panel.begin("Qwen/Qwen3-0.6B")
        for at, event in events:
            panel.apply(event, at)
        await pilot.pause()

    assert snap_compare(recorded_app(samples, store), terminal_size=(120, 36), run_before=run)


def _downloading(file: str, completed: int, total: int, overall: int) -> PullProgress:
    return PullProgress(
        status=f"pulling {file}",
        phase="downloading",
        model="hf.co/Qwen/Qwen3-0.6B",
        file=file,
        completed=completed,
        total=total,
        overall_completed=overall,
        overall_total=MODEL_BYTES,
    )
