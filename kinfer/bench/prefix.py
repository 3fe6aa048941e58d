"""The prefix scenario: what a long, shared system prompt costs cold and what reusing it saves.

An agent's conversation runs three turns on one long system prompt (each turn sends the previous answer
and a new user message), then a new conversation starts with the same system prompt. Turn 1 is cold;
turns 2-3 can reuse the whole conversation so far, and the new conversation can reuse the system
prompt. Each step reports its time to first token and the prompt tokens the server says it reused
(`usage.prompt_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass

import httpx

from kinfer.bench.clients import Target, stream_chat
from kinfer.bench.load import DEFAULT_TIMEOUT_S, make_client
from kinfer.bench.prompts import PromptSizer, filler, prompt_text
from kinfer.bench.stats import RequestResult
from kinfer.bench.sweep import calibrate

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_TOKENS = 9000
DEFAULT_TURN_TOKENS = 48
DEFAULT_PREFIX_MAX_TOKENS = 32


@dataclass(frozen=True)
class PrefixConfig:
    """Sizes of the prefix scenario."""

    system_tokens: int = DEFAULT_SYSTEM_TOKENS
    turn_tokens: int = DEFAULT_TURN_TOKENS  # each user message
    max_tokens: int = DEFAULT_PREFIX_MAX_TOKENS  # each answer
    turns: int = 3
    temperature: float = 0.0
    timeout_s: float = DEFAULT_TIMEOUT_S

    def context_needed(self) -> int:
        """Tokens a row must hold for the last turn, with room for template and estimate error."""
        per_turn = self.turn_tokens + self.max_tokens + 16
        return int(self.system_tokens * 1.1) + self.turns * per_turn + 256


@dataclass(frozen=True)
class PrefixStep:
    """One request of the scenario."""

    name: str
    result: RequestResult

    @property
    def reused(self) -> bool:
        return self.result.cached_tokens > 0


@dataclass(frozen=True)
class PrefixRun:
    target: Target
    config: PrefixConfig
    steps: tuple[PrefixStep, ...]
    started_at: str
    notes: tuple[str, ...] = ()

    def step(self, name: str) -> PrefixStep:
        return next(s for s in self.steps if s.name == name)


def system_prompt(tokens: int, sizer: PromptSizer, seed: int) -> str:
    """A long system prompt of about `tokens` tokens (the template's own tokens are not counted)."""
    words = max(1, round(tokens / sizer.tokens_per_word))
    return f"You are agent {seed}. Reference notes follow.\n\n{filler(words, seed)}"


async def run_prefix(target: Target, config: PrefixConfig) -> PrefixRun:
    """Turns 1..N of one conversation, then a new conversation on the same system prompt."""
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    seeds = itertools.count(random.randrange(10**6) * 1000)
    notes: list[str] = []
    async with make_client(2, config.timeout_s) as client:
        try:
            sizer = await calibrate(client, target, seeds)
        except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
            sizer = PromptSizer()
            notes.append(f"prompt size not calibrated ({exc})")
        system = {"role": "system", "content": system_prompt(config.system_tokens, sizer, next(seeds))}
        user_words = max(4, round(config.turn_tokens / sizer.tokens_per_word))
        steps: list[PrefixStep] = []
        history: list[dict[str, str]] = [system]
        for turn in range(1, config.turns + 1):
            history.append({"role": "user", "content": prompt_text(user_words, next(seeds))})
            result = await stream_chat(
                client, target, history, config.max_tokens, temperature=config.temperature
            )
            name = f"turn {turn}" + (" (cold)" if turn == 1 else "")
            steps.append(PrefixStep(name, result))
            if not result.ok:
                notes.append(f"{name} failed: {result.error}")
                break
            history.append({"role": "assistant", "content": result.text})
        fresh = [system, {"role": "user", "content": prompt_text(user_words, next(seeds))}]
        result = await stream_chat(client, target, fresh, config.max_tokens, temperature=config.temperature)
        steps.append(PrefixStep("new conversation", result))
        if any(s.result.usage_source != "usage" for s in steps if s.result.ok):
            notes.append("the server reports no usage in its stream: reused tokens unknown")
    for step in steps:
        log.info(
            "%s %s: prompt %d, reused %d, ttft %s",
            target.label,
            step.name,
            step.result.prompt_tokens,
            step.result.cached_tokens,
            step.result.ttft,
        )
    return PrefixRun(target, config, tuple(steps), started_at, tuple(notes))
