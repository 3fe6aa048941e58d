"""The concurrency sweep: for each level, N requests with at most C in flight, then a summary.

Before the first level the prompt size is calibrated with the server's own usage (two non-streaming
1-token requests) and one short streaming request warms the path (model load, JIT), so no level pays
for them.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from kinfer.bench.clients import ChatMessages, Target, count_prompt_tokens, stream_chat
from kinfer.bench.load import DEFAULT_TIMEOUT_S, make_client, send_all
from kinfer.bench.memory import MemoryProbe
from kinfer.bench.prompts import PromptSizer, fit_sizer, prompt_text
from kinfer.bench.stats import LevelSummary, RequestResult, summarize_level

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = (1, 4, 16, 64)
DEFAULT_PROMPT_TOKENS = 128
DEFAULT_MAX_TOKENS = 128
CALIBRATION_WORDS = (8, 40)  # two small prompts: the line through them sizes every prompt
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class SweepConfig:
    """What every level of a sweep sends."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    max_tokens: int = DEFAULT_MAX_TOKENS
    requests_per_level: int | None = None  # None: one request per concurrent stream
    temperature: float = 0.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    calibrate: bool = True
    warmup: bool = True  # a short round at each level's concurrency before measuring it

    def requests_for(self, concurrency: int) -> int:
        """At least one round: every concurrent stream sends at least one request."""
        return max(concurrency, self.requests_per_level or concurrency)


@dataclass(frozen=True)
class SweepRun:
    """One target's sweep: who was measured, with what, and each level's summary."""

    target: Target
    config: SweepConfig
    sizer: PromptSizer
    levels: tuple[LevelSummary, ...]
    started_at: str  # ISO 8601, UTC
    notes: tuple[str, ...] = ()


@dataclass
class PromptFactory:
    """Unique prompts of about `tokens` tokens: a fresh seed for every request of the run."""

    sizer: PromptSizer
    seeds: Iterator[int] = field(default_factory=lambda: itertools.count(random.randrange(10**6) * 1000))

    def make(self, tokens: int) -> tuple[list[dict[str, str]], int]:
        """(messages, the prompt tokens the sizer expects)."""
        words = self.sizer.words_for(tokens)
        return [{"role": "user", "content": prompt_text(words, next(self.seeds))}], self.sizer.estimate(words)


async def calibrate(client: httpx.AsyncClient, target: Target, seeds: Iterator[int]) -> PromptSizer:
    """Fit tokens-per-word and the template overhead from the server's usage at two small sizes.

    Small, so that a tokenizer with many tokens per word (byte-level) still fits a short context; the
    seeds come from the run's own counter so the "Note N:" tag has the same size as in the run.
    """
    samples = []
    for words in CALIBRATION_WORDS:
        for attempt in range(2):  # one retry: some servers fail a request now and then
            messages = [{"role": "user", "content": prompt_text(words, next(seeds))}]
            try:
                samples.append((words, await count_prompt_tokens(client, target, messages)))
                break
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError):
                if attempt:
                    raise
    sizer = fit_sizer(samples)
    log.info(
        "%s: %.2f tokens/word, %.0f tokens of template", target.label, sizer.tokens_per_word, sizer.overhead
    )
    return sizer


async def run_level(
    client: httpx.AsyncClient,
    target: Target,
    prompts: Sequence[tuple[ChatMessages, int]],
    *,
    concurrency: int,
    max_tokens: int,
    temperature: float = 0.0,
) -> LevelSummary:
    """Send every prompt with at most `concurrency` in flight (from several client processes past
    `load.STREAMS_PER_CLIENT`); summarize when all are done. `client` probes the server's memory."""
    job = functools.partial(_stream_prompt, target=target, max_tokens=max_tokens, temperature=temperature)
    async with MemoryProbe(client, target) as probe:
        results = await send_all(
            job, prompts, concurrency=concurrency, timeout_s=client.timeout.read or DEFAULT_TIMEOUT_S
        )
    # first request sent -> last reply finished (perf_counter is the system's monotonic clock, the same
    # in every client process)
    wall = max(r.finished for r in results) - min(r.started for r in results) if results else 0.0
    return summarize_level(concurrency, results, max_tokens=max_tokens, wall_s=wall, memory=probe.peak())


async def _stream_prompt(
    client: httpx.AsyncClient,
    prompt: tuple[ChatMessages, int],
    *,
    target: Target,
    max_tokens: int,
    temperature: float,
) -> RequestResult:
    messages, estimate = prompt
    return await stream_chat(
        client, target, messages, max_tokens, temperature=temperature, prompt_estimate=estimate
    )


async def run_sweep(
    target: Target,
    config: SweepConfig,
    *,
    on_level: Callable[[LevelSummary], None] | None = None,
    fallback_sizer: PromptSizer | None = None,
) -> SweepRun:
    """Calibrate, then run every level of `config.concurrency` in order, each after a warm-up round.

    The warm-up round sends the level's number of short requests at the level's concurrency, so
    kernels compiled for a new batch size (MLX) or buffers grown for it never land in the level's
    numbers. Each level gets fresh connections. `fallback_sizer` (e.g. another server's calibration
    on the same tokenizer) is used when this server cannot be calibrated.
    """
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    notes: list[str] = []
    seeds = itertools.count(random.randrange(10**6) * 1000)
    sizer = fallback_sizer or PromptSizer()
    async with make_client(1, config.timeout_s) as client:
        if config.calibrate:
            try:
                sizer = await calibrate(client, target, seeds)
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
                how = "another server's calibration" if fallback_sizer else "the default"
                notes.append(
                    f"prompt size not calibrated ({exc}); used {how}: {sizer.tokens_per_word:.2f} tokens/word"
                )
                log.warning("%s: %s", target.label, notes[-1])
    factory = PromptFactory(sizer, seeds)
    levels = []
    for concurrency in config.concurrency:
        # fresh connections per level: idle keep-alive connections a server has dropped would fail
        async with make_client(concurrency, config.timeout_s) as client:
            if config.warmup:
                warm = [factory.make(config.prompt_tokens) for _ in range(concurrency)]
                summary = await run_level(
                    client, target, warm, concurrency=concurrency, max_tokens=WARMUP_TOKENS
                )
                if summary.errors:
                    notes.append(
                        f"warm-up at {concurrency}: {summary.errors} errors ({summary.error_messages[0]})"
                    )
                if not levels and summary.ok and summary.usage_sources != ("usage",):
                    notes.append("the server streams no usage: completion tokens counted from chunks")
            prompts = [factory.make(config.prompt_tokens) for _ in range(config.requests_for(concurrency))]
            summary = await run_level(
                client,
                target,
                prompts,
                concurrency=concurrency,
                max_tokens=config.max_tokens,
                temperature=config.temperature,
            )
        levels.append(summary)
        if on_level is not None:
            on_level(summary)
    return SweepRun(target, config, sizer, tuple(levels), started_at, tuple(notes))
