"""The bench's arithmetic: percentiles, per-request rates, and how a level folds its requests."""

from __future__ import annotations

import pytest

from kinfer.bench.stats import MemoryPeak, RequestResult, percentile, summarize_level


def request(
    start: float,
    first: float,
    last: float,
    *,
    tokens: int = 9,
    prompt: int = 100,
    cached: int = 0,
    error: str | None = None,
) -> RequestResult:
    return RequestResult(
        started=start,
        finished=last + 0.01,
        first_token=first,
        last_token=last,
        prompt_tokens=prompt,
        completion_tokens=tokens,
        cached_tokens=cached,
        error=error,
    )


def test_percentiles_interpolate_between_ranks_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]  # order does not matter
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 95) == pytest.approx(3.85)  # numpy.percentile([1,2,3,4], 95)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_a_request_measures_ttft_and_its_decode_rate_after_the_first_token():
    r = request(10.0, 10.5, 12.5, tokens=9, prompt=200, cached=100)
    assert r.ttft == pytest.approx(0.5)
    # 9 tokens: the first arrives at 10.5, the other 8 in the 2 s after it
    assert r.stream_tps == pytest.approx(4.0)
    # the 100 uncached prompt tokens took the 0.5 s before the first token
    assert r.prompt_tps == pytest.approx(200.0)


def test_a_request_without_a_measurable_interval_has_no_rate():
    one_token = request(0.0, 1.0, 1.0, tokens=1)
    assert one_token.stream_tps is None
    no_reply = RequestResult(started=0.0, finished=1.0, error="HTTP 503: busy")
    assert not no_reply.ok
    assert no_reply.ttft is None and no_reply.stream_tps is None and no_reply.prompt_tps is None


def test_aggregate_rate_is_all_tokens_over_wall_time_while_streams_are_rated_one_by_one():
    # two streams of 11 tokens side by side over 2 s: each decodes 10 tokens in 1.5 s after its start
    results = [request(0.0, 0.5, 2.0, tokens=11), request(0.0, 0.4, 1.9, tokens=11)]
    level = summarize_level(2, results, max_tokens=11)
    assert level.wall_s == pytest.approx(2.01)
    assert level.aggregate_tps == pytest.approx(22 / 2.01)
    assert level.stream_tps_p50 == pytest.approx(10 / 1.5)
    assert level.ttft_p50 == pytest.approx(0.45)
    assert level.ok == 2 and level.errors == 0 and level.short_replies == 0


def test_failed_requests_count_as_errors_and_add_no_tokens():
    results = [
        request(0.0, 0.5, 1.5, tokens=5),
        RequestResult(started=0.0, finished=0.2, error="HTTP 503: the queue is full"),
        RequestResult(started=0.0, finished=0.3, error="HTTP 503: the queue is full"),
        RequestResult(started=0.0, finished=0.3, error="ReadTimeout: timed out"),
    ]
    level = summarize_level(4, results, max_tokens=8, wall_s=2.0)
    assert (level.requests, level.ok, level.errors) == (4, 1, 3)
    assert level.completion_tokens == 5
    assert level.aggregate_tps == pytest.approx(2.5)
    # the same message is reported once
    assert level.error_messages == ("HTTP 503: the queue is full", "ReadTimeout: timed out")
    # the one reply stopped at 5 of 8 tokens
    assert level.short_replies == 1


def test_a_level_where_everything_failed_still_summarizes():
    level = summarize_level(1, [RequestResult(started=0.0, finished=1.0, error="refused")], max_tokens=8)
    assert level.ok == 0 and level.aggregate_tps == 0.0
    assert level.ttft_p50 is None and level.stream_tps_p50 is None


def test_engine_memory_total_leaves_out_high_water_marks():
    peak = MemoryPeak(rss_bytes=10, engine_bytes={"mlx_active": 300, "mlx_cache": 50, "mlx_peak": 400})
    assert peak.engine_total == 350
    # the memory account: its parts explain the total, so only the total and the cache beside it count
    account = {"weights": 100, "kv": 150, "scratch": 50, "cache": 20, "total": 300, "peak": 400}
    assert MemoryPeak(engine_bytes=account).engine_total == 320
    assert MemoryPeak(engine_bytes=account).named_share == round(300 / 300, 3)
    # with the account of the sample where the total peaked, the share is that sample's, not a sum of
    # peaks taken at different moments
    at_peak = {"weights": 100, "kv": 150, "scratch": 20, "unexplained": 130, "total": 400}
    assert MemoryPeak(engine_bytes=account, at_peak=at_peak).named_share == round(270 / 400, 3)
    assert MemoryPeak(engine_bytes={"kv": 1}).named_share is None
    assert MemoryPeak().engine_total is None
