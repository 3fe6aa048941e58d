"""Sampling on the device, every row at once, in llama.cpp's order.

repeat / frequency / presence penalties -> top-k -> top-p -> min-p -> temperature -> draw. Each row has
its own parameters and seed; temperature <= 0 is greedy (argmax after the penalties). The draw uses a
counter-based hash of (seed, position) rather than a shared generator, so a row's tokens depend only on
its own seed and prompt, never on which other rows share the batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kinfer.protocol import Sampling

PENALTY_WINDOW_MAX = 256  # the longest repeat_last_n honoured
_U32 = mx.uint32


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling parameters of one decode batch, as device arrays (built once per batch shape)."""

    all_greedy: bool
    penalties: bool
    candidates: int  # K: tokens kept after top-k (the whole vocabulary when some row disables top-k)
    greedy: mx.array  # [B] bool
    temperature: mx.array  # [B] float32
    top_k: mx.array  # [B] int32, clipped to 1..K
    top_p: mx.array  # [B] float32
    min_p: mx.array  # [B] float32
    repeat_penalty: mx.array  # [B] float32
    frequency_penalty: mx.array
    presence_penalty: mx.array
    window: mx.array  # [B] int32: repeat_last_n
    seeds: mx.array  # [B] uint32


def resolve_seed(sampling: Sampling) -> int:
    """The row's seed: the request's, or a fresh random one."""
    return (sampling.seed if sampling.seed is not None else random.getrandbits(32)) & 0xFFFFFFFF


def needs_penalties(sampling: Sampling) -> bool:
    return (
        sampling.repeat_penalty != 1.0
        or sampling.frequency_penalty != 0.0
        or sampling.presence_penalty != 0.0
    ) and sampling.repeat_last_n != 0


def history_row(prompt: Sequence[int]) -> mx.array:
    """A row's penalty history at its start: the prompt's last tokens, -1 before them."""
    tail = list(prompt[-PENALTY_WINDOW_MAX:])
    return mx.array([-1] * (PENALTY_WINDOW_MAX - len(tail)) + tail, dtype=mx.int32)


def push_history(history: mx.array, tokens: mx.array) -> mx.array:
    """[B, N] recent tokens with each row's new token appended and its oldest dropped."""
    return mx.concatenate([history[:, 1:], tokens[:, None]], axis=1)


def make_batch(samplings: Sequence[Sampling], seeds: Sequence[int], vocab: int) -> SamplingBatch:
    greedy = np.array([s.greedy for s in samplings], dtype=bool)
    top_k = np.array([s.top_k if s.top_k > 0 else vocab for s in samplings], dtype=np.int64)
    candidates = int(min(vocab, top_k[~greedy].max())) if (~greedy).any() else 1
    window = [
        PENALTY_WINDOW_MAX if s.repeat_last_n < 0 else min(s.repeat_last_n, PENALTY_WINDOW_MAX)
        for s in samplings
    ]

    def f32(values) -> mx.array:
        return mx.array(np.asarray(values, dtype=np.float32))

    return SamplingBatch(
        all_greedy=bool(greedy.all()),
        penalties=any(needs_penalties(s) for s in samplings),
        candidates=candidates,
        greedy=mx.array(greedy),
        temperature=f32([max(s.temperature, 1e-6) for s in samplings]),
        top_k=mx.array(np.clip(top_k, 1, candidates).astype(np.int32)),
        top_p=f32([s.top_p if 0.0 < s.top_p < 1.0 else 1.0 for s in samplings]),
        min_p=f32([max(s.min_p, 0.0) for s in samplings]),
        repeat_penalty=f32([s.repeat_penalty if s.repeat_penalty > 0 else 1.0 for s in samplings]),
        frequency_penalty=f32([s.frequency_penalty for s in samplings]),
        presence_penalty=f32([s.presence_penalty for s in samplings]),
        window=mx.array(np.asarray(window, dtype=np.int32)),
        seeds=mx.array(np.asarray(seeds, dtype=np.uint32)),
    )


def sample(
    logits: mx.array, batch: SamplingBatch, counters: mx.array | None, history: mx.array | None = None
) -> mx.array:
    """Next token of every row. logits [B, V]; counters [B] uint32 (the row's position: a fresh random
    number per step; may be None when every row is greedy); history [B, N] int32 recent tokens, oldest
    first, -1 where empty."""
    if batch.penalties and history is not None:
        logits = _penalize(logits.astype(mx.float32), history, batch)
    greedy_tokens = mx.argmax(logits, axis=-1).astype(mx.int32)
    if batch.all_greedy:
        return greedy_tokens
    return mx.where(batch.greedy, greedy_tokens, _draw(logits.astype(mx.float32), batch, counters))


def mask_logits(logits: mx.array, words: mx.array) -> mx.array:
    """Tokens a row's grammar forbids set to -inf. words [B, W] int32: bit t % 32 of word t // 32 set =
    token t allowed (llguidance's bitmask); a row of all ones (-1) is unconstrained."""
    token = mx.arange(logits.shape[-1], dtype=mx.int32)
    bits = mx.right_shift(mx.take(words, token // 32, axis=1), token % 32) & 1
    return mx.where(bits.astype(mx.bool_), logits, -mx.inf)


def _penalize(logits: mx.array, history: mx.array, batch: SamplingBatch) -> mx.array:
    b, n = history.shape
    recent = mx.arange(n)[None, :] >= (n - batch.window[:, None])
    valid = (history >= 0) & recent
    # invalid entries add 0 to token 0: harmless, and no conflicting writes as with a plain scatter
    rows = mx.broadcast_to(mx.arange(b)[:, None], (b, n))
    counts = (
        mx.zeros(logits.shape, dtype=mx.float32)
        .at[rows, mx.maximum(history, 0)]
        .add(valid.astype(mx.float32))
    )
    seen = counts > 0
    penalty = batch.repeat_penalty[:, None]
    repeated = mx.where(logits > 0, logits / penalty, logits * penalty)
    logits = mx.where(seen, repeated, logits)
    return logits - counts * batch.frequency_penalty[:, None] - seen * batch.presence_penalty[:, None]


def _draw(logits: mx.array, batch: SamplingBatch, counters: mx.array) -> mx.array:
    k = batch.candidates
    vocab = logits.shape[-1]
    if k >= vocab:
        order = mx.argsort(-logits, axis=-1)
    else:
        part = mx.argpartition(-logits, k - 1, axis=-1)[:, :k]
        order = mx.take_along_axis(
            part, mx.argsort(-mx.take_along_axis(logits, part, axis=-1), axis=-1), axis=-1
        )
    values = mx.take_along_axis(logits, order, axis=-1)  # [B, K], best first
    rank = mx.arange(values.shape[-1])[None, :]
    keep = rank < batch.top_k[:, None]
    values = mx.where(keep, values, -mx.inf)
    probs = mx.softmax(values, axis=-1)
    # top-p: keep the smallest head whose mass reaches p (the first token always stays)
    keep = keep & ((mx.cumsum(probs, axis=-1) - probs) < batch.top_p[:, None])
    keep = keep & (probs >= batch.min_p[:, None] * probs[:, :1])
    values = mx.where(keep, values / batch.temperature[:, None], -mx.inf)
    cdf = mx.cumsum(mx.softmax(values, axis=-1), axis=-1)
    u = uniform(batch.seeds, counters)[:, None] * cdf[:, -1:]
    choice = mx.minimum((cdf <= u).sum(axis=-1), keep.sum(axis=-1) - 1)
    return mx.take_along_axis(order, choice[:, None].astype(mx.int32), axis=-1)[:, 0].astype(mx.int32)


def _mix(x: mx.array) -> mx.array:
    """A 32-bit integer hash (lowbias32): a counter becomes a well-spread random word."""
    x = x ^ (x >> 16)
    x = x * mx.array(0x7FEB352D, dtype=_U32)
    x = x ^ (x >> 15)
    x = x * mx.array(0x846CA68B, dtype=_U32)
    return x ^ (x >> 16)


def uniform(seeds: mx.array, counters: mx.array) -> mx.array:
    """A number in [0, 1) for each (seed, counter) pair."""
    word = _mix(seeds.astype(_U32) ^ _mix(counters.astype(_U32) + mx.array(0x9E3779B9, dtype=_U32)))
    return (word >> 8).astype(mx.float32) * (1.0 / (1 << 24))
