"""What rank 0 decided since the last step, broadcast to every rank before the step runs.

A follower's engine is a replica of rank 0's: same model shard, same rows, same prefix pool. Given the
same calls in the same order (`submit`, `cancel`, `step`) and the same state of the one thing that
learns from the clock (the prefill budget: how many prompt tokens fit beside decoding rows), it makes
the same admissions,
pool adoptions, chunks and releases, so its forward passes have the same shapes as rank 0's and the
collectives inside the model meet. Sampled tokens are agreed inside the graph (agree.py).

The plan travels as bytes through `mx.distributed.all_sum` (rank 0 sends them, the others zeros): a
fixed header first (the budget's floats as their bits: exact), then the body when there is one.
Decode-only steps send the header only. The body
is a pickle of kinfer's own frozen dataclasses: the ranks are one operator's processes on a private
network (the same trust as the tensors they exchange).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Literal

import mlx.core as mx
import numpy as np

from kinfer.engines.base import GenerationJob

Kind = Literal["step", "load", "close", "exit"]
_KINDS: tuple[Kind, ...] = ("step", "load", "close", "exit")
_HEADER = 7  # kind, body length, the budget's last chunk, its per-token and decode seconds (2 each)
Budget = tuple[int, float | None, float | None]  # PrefillBudget's last_chunk, per_token_s, decode_s


@dataclass(frozen=True)
class Submit:
    job: GenerationJob


@dataclass(frozen=True)
class Cancel:
    job_id: str


@dataclass(frozen=True)
class Load:
    """Build the engine: the model (by store name) and the constructor arguments rank 0 resolved
    (rows and ctx explicit, so every rank sizes alike whatever its own memory)."""

    model: str
    kwargs: dict
    size: object  # the engine's SizePlan


@dataclass(frozen=True)
class Plan:
    kind: Kind = "step"
    budget: Budget = (0, None, None)  # what rank 0's prefill budget had learned when the step began
    calls: tuple[Submit | Cancel, ...] = ()
    load: Load | None = None


def broadcast(plan: Plan | None, group: mx.distributed.Group) -> Plan:
    """Rank 0 passes its plan; every rank (rank 0 included) gets rank 0's back."""
    sender = group.rank() == 0
    header = np.zeros(_HEADER, dtype=np.int32)
    body = b""
    if sender:
        assert plan is not None
        if plan.calls or plan.load is not None:
            body = pickle.dumps((plan.calls, plan.load), protocol=pickle.HIGHEST_PROTOCOL)
        last, per_token, decode = plan.budget
        header[:3] = (_KINDS.index(plan.kind), len(body), last)
        header[3:] = np.array([_nan(per_token), _nan(decode)], dtype=np.float64).view(np.int32)
    got = _sum(header, group)
    kind, length, last = (int(v) for v in got[:3])
    per_token, decode = (None if np.isnan(v) else float(v) for v in got[3:].astype(np.int32).view(np.float64))
    calls: tuple = ()
    load = None
    if length:
        raw = np.frombuffer(body, dtype=np.uint8) if sender else np.zeros(length, dtype=np.uint8)
        calls, load = pickle.loads(_sum(raw, group).astype(np.uint8).tobytes())
    return Plan(_KINDS[kind], (last, per_token, decode), calls, load)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _sum(values: np.ndarray, group: mx.distributed.Group) -> np.ndarray:
    mx.synchronize()
    # int32 on the wire: every rank but rank 0 adds zeros, so the sum is rank 0's values exactly
    summed = mx.distributed.all_sum(mx.array(values.astype(np.int32)), group=group)
    mx.eval(summed)
    return np.array(summed)
