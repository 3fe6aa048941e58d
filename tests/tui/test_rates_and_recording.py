"""Rates from successive snapshots, and recordings that replay exactly what was recorded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kinfer.scheduler import RequestSnapshot, SchedulerSnapshot
from kinfer.tui.rates import RateTracker, token_counts
from kinfer.tui.recording import RecordedSource, load_recording, save_recording
from kinfer.tui.sample import DashboardSample, LogEntry
from tests.tui.conftest import idle_sample


def row(
    request_id: str, generated: int, *, prompt: int = 100, reused: int = 0, finish=None
) -> RequestSnapshot:
    return RequestSnapshot(
        request_id=request_id,
        dialect="openai",
        model="m",
        state="done" if finish else "decoding",
        prompt_tokens=prompt,
        prompt_processed=prompt,
        generated=generated,
        reused=reused,
        tokens_per_second=0.0,
        age=1.0,
        tail="",
        finish=finish,
    )


def snap(at: float, requests: tuple[RequestSnapshot, ...], *, generated=0, prompt=0, reused=0):
    return SchedulerSnapshot(
        taken_at=at,
        models=(),
        requests=requests,
        queue_depth=0,
        outcomes={},
        prompt_tokens_total=prompt,
        generated_tokens_total=generated,
        reused_tokens_total=reused,
    )


def test_a_request_finishing_between_samples_is_counted_once() -> None:
    """Its tokens move from its row into the totals; the rate sees only the new ones."""
    tracker = RateTracker(window=0.5)
    tracker.update(snap(100.0, (row("a", 10), row("b", 20))))
    rates = tracker.update(snap(101.0, (row("b", 30), row("a", 15, finish="stop")), generated=15, prompt=100))
    # a: 10 -> 15 (now in the totals), b: 20 -> 30; nothing else was generated
    assert rates.decode == 15.0
    assert rates.prompt == 0.0  # a's prompt was already counted while it ran


def test_reused_prompt_tokens_are_not_prompt_work() -> None:
    counts = token_counts(snap(1.0, (row("a", 0, prompt=300, reused=200),), prompt=50, reused=20))
    assert counts.prompt == (50 - 20) + (300 - 200)


def test_rates_average_over_the_window_and_keep_a_history() -> None:
    tracker = RateTracker(window=1.0)
    generated = [0, 0, 8, 8, 16]  # a slow model: a step every other sample
    for i, count in enumerate(generated):
        tracker.update(snap(10.0 + i * 0.5, (row("a", count),)))
    # 8 tokens a second, the rate the model runs at; sample to sample it would read 16, then 0
    assert tracker.latest.decode == 8.0
    assert len(tracker.decode_history) == 4
    assert min(tracker.decode_history) >= 0


def test_a_recording_round_trips_through_json(tmp_path: Path, burst) -> None:
    path = tmp_path / "again.json"
    save_recording(burst, path)
    assert load_recording(path) == burst


def test_a_recorded_source_replays_then_holds_the_last_sample() -> None:
    entry = LogEntry(1.0, "r1", "ollama", "m", 10, 5, "stop", 0.5)
    first = idle_sample(1.0)
    last = replace(idle_sample(2.0), finished=(entry,))
    source = RecordedSource([first, last])
    assert source() is first
    assert source() is last
    again = source()
    assert again.scheduler == last.scheduler
    assert again.finished == ()  # a finished request is logged once, however long the test runs
    assert isinstance(again, DashboardSample)


def test_the_burst_recording_is_a_real_busy_server(burst) -> None:
    """What the under-load snapshots show: rows decoding, a queue drained, requests finished."""
    last = burst[-1].scheduler
    assert {r.dialect for r in last.requests} == {"ollama", "openai", "anthropic"}
    assert any(r.finish is None and r.generated > 0 for r in last.requests)
    assert sum(len(s.finished) for s in burst) == 3
    assert last.models[0].name == "smollm2:135m" and last.models[0].engine == "llama.cpp"
