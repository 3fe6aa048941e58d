"""The benchmark's arithmetic: one request's timings and counts, and a concurrency level's summary.

Definitions (docs/benchmarks.md repeats them):
- time to first token (TTFT): request sent -> first chunk carrying generated text, queueing included.
- per-stream tok/s: (completion tokens - 1) / (last token - first token), the decode rate one client
  sees once its reply has started.
- aggregate tok/s: all completion tokens of a level / the level's wall time (first request sent ->
  last reply finished), so prefill and queueing count against it.
- prompt tok/s: per request, uncached prompt tokens / TTFT; the level reports the median.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

UsageSource = Literal["usage", "chunks", "estimate"]


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default);
    None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class RequestResult:
    """One streamed request, as the client saw it. Times are `time.perf_counter()` seconds."""

    started: float
    finished: float
    first_token: float | None = None  # first chunk with generated text
    last_token: float | None = None  # last chunk with generated text
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the server reused (usage.prompt_tokens_details.cached_tokens)
    finish_reason: str | None = None
    usage_source: UsageSource = "usage"  # where the token counts came from
    error: str | None = None
    retries: int = 0  # connections that failed before any response and were tried again
    text: str = field(default="", repr=False)  # the reply (the prefix scenario sends it back)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def stream_tps(self) -> float | None:
        """Decode tok/s after the first token; None when there is no interval to measure."""
        if self.first_token is None or self.last_token is None or self.completion_tokens < 2:
            return None
        span = self.last_token - self.first_token
        return (self.completion_tokens - 1) / span if span > 0 else None

    @property
    def prompt_tps(self) -> float | None:
        """Uncached prompt tokens per second of TTFT (a lower bound on prefill speed under load)."""
        ttft = self.ttft
        computed = self.prompt_tokens - self.cached_tokens
        if ttft is None or ttft <= 0 or computed <= 0:
            return None
        return computed / ttft


@dataclass(frozen=True)
class MemoryPeak:
    """The largest memory numbers seen while a level ran."""

    rss_bytes: int | None = None  # resident set of the server process (and its children)
    engine_bytes: dict[str, int] = field(default_factory=dict)  # kinfer_engine_memory_bytes by kind
    at_peak: dict[str, int] = field(default_factory=dict)  # the account sampled when total was largest

    @property
    def engine_total(self) -> int | None:
        """The engine's memory: the allocator's total and MLX's cache beside it (the memory account,
        kinfer/engines/memory_account.py); without them (an older kinfer), every kind but the
        high-water marks (named *peak*), which would count twice."""
        if "total" in self.engine_bytes:
            return self.engine_bytes["total"] + self.engine_bytes.get("cache", 0)
        kinds = [v for k, v in self.engine_bytes.items() if "peak" not in k]
        return sum(kinds) if kinds else None

    @property
    def named_share(self) -> float | None:
        """How much of the allocator's total the account's named parts (weights, kv, state, pool and
        scratch; `unexplained` is the rest) explain in the sample where the total was largest (each
        part at its own peak where only those are known); None without an account. Issue 18 asks
        for >= 0.9."""
        account = self.at_peak or self.engine_bytes
        total = account.get("total")
        if not total:
            return None
        named = sum(account.get(k, 0) for k in ("weights", "kv", "state", "pool", "scratch"))
        return round(named / total, 3)


@dataclass(frozen=True)
class LevelSummary:
    """What one concurrency level measured."""

    concurrency: int
    requests: int
    ok: int
    errors: int
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    aggregate_tps: float
    stream_tps_p50: float | None
    stream_tps_min: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    prompt_tps_p50: float | None
    short_replies: int  # successful replies whose usage shows they stopped before max_tokens
    retries: int = 0  # connection retries (see clients.stream_chat)
    usage_sources: tuple[str, ...] = ()
    memory: MemoryPeak = field(default_factory=MemoryPeak)
    error_messages: tuple[str, ...] = ()


MAX_ERROR_MESSAGES = 3


def summarize_level(
    concurrency: int,
    results: Sequence[RequestResult],
    *,
    max_tokens: int,
    wall_s: float | None = None,
    memory: MemoryPeak | None = None,
) -> LevelSummary:
    """Fold a level's request results into its summary. `wall_s` defaults to the span from the first
    request sent to the last one finished."""
    if wall_s is None:
        wall_s = (max(r.finished for r in results) - min(r.started for r in results)) if results else 0.0
    good = [r for r in results if r.ok]
    completion = sum(r.completion_tokens for r in good)
    errors: list[str] = []
    for r in results:
        if r.error is not None and r.error not in errors and len(errors) < MAX_ERROR_MESSAGES:
            errors.append(r.error)
    stream_rates = [x for r in good if (x := r.stream_tps) is not None]
    ttfts = [x for r in good if (x := r.ttft) is not None]
    prompt_rates = [x for r in good if (x := r.prompt_tps) is not None]
    return LevelSummary(
        concurrency=concurrency,
        requests=len(results),
        ok=len(good),
        errors=len(results) - len(good),
        wall_s=wall_s,
        prompt_tokens=sum(r.prompt_tokens for r in good),
        completion_tokens=completion,
        cached_tokens=sum(r.cached_tokens for r in good),
        aggregate_tps=completion / wall_s if wall_s > 0 else 0.0,
        stream_tps_p50=percentile(stream_rates, 50),
        stream_tps_min=min(stream_rates) if stream_rates else None,
        ttft_p50=percentile(ttfts, 50),
        ttft_p95=percentile(ttfts, 95),
        prompt_tps_p50=percentile(prompt_rates, 50),
        # a count from chunks undercounts (one chunk can hold several tokens): only usage can tell
        short_replies=sum(1 for r in good if r.usage_source == "usage" and r.completion_tokens < max_tokens),
        retries=sum(r.retries for r in results),
        usage_sources=tuple(sorted({r.usage_source for r in good})),
        memory=memory or MemoryPeak(),
        error_messages=tuple(errors),
    )
