"""What rank 0 decided since the last step, broadcast to every rank before the step runs.

A follower's engine is a replica of rank 0's: same model shard, same rows, same prefix pool. Given the
same calls in the same order (`submit`, `cancel`, `step`) and the same answer to the one question that
depends on the clock (how many prompt tokens fit beside decoding rows), it makes the same admissions,
pool adoptions, chunks and releases, so its forward passes have the same shapes as rank 0's and the
collectives inside the model meet. Sampled tokens are agreed inside the graph (agree.py).

The plan travels as bytes through `mx.distributed.all_sum` (rank 0 sends them, the others zeros): a
fixed header first, then the body when there is one. Decode-only steps send the header only. The body
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
_HEADER = 4  # kind, room beside decoding rows, room without, body length


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
    room_decoding: int = 0  # prompt tokens a step may take beside decoding rows
    room_alone: int = 0  # ... and when no row decodes
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
        header[:] = (_KINDS.index(plan.kind), plan.room_decoding, plan.room_alone, len(body))
    got = _sum(header, group)
    kind, room_decoding, room_alone, length = (int(v) for v in got)
    calls: tuple = ()
    load = None
    if length:
        raw = np.frombuffer(body, dtype=np.uint8) if sender else np.zeros(length, dtype=np.uint8)
        calls, load = pickle.loads(_sum(raw, group).astype(np.uint8).tobytes())
    return Plan(_KINDS[kind], room_decoding, room_alone, calls, load)


def _sum(values: np.ndarray, group: mx.distributed.Group) -> np.ndarray:
    mx.synchronize()
    # int32 on the wire: every rank but rank 0 adds zeros, so the sum is rank 0's values exactly
    summed = mx.distributed.all_sum(mx.array(values.astype(np.int32)), group=group)
    mx.eval(summed)
    return np.array(summed)
