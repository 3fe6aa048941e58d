"""How many primitives one step's lazy graph holds (issue 20's proxy for MLX's launch cost).

MLX encodes and launches a graph primitive by primitive (on CUDA ~5 us of host time each), so the count
of primitives a decode step builds is the number to cut, and it can be measured on any machine: a CPU
build gives the same graph as a GPU build. `OpCounter` stands in for the engine's step timer
(step_timer.py) and counts each graph handed to `mx.async_eval` (one per pass the step launches: one
for a decode-only step), by walking it with `mx.export_to_dot`
(everything not yet evaluated: this step's work only, since the previous step's arrays were evaluated
or scheduled already). Slow (a text dump per step): run it apart from timed runs.
"""

from __future__ import annotations

import io
import re
from collections import Counter

import mlx.core as mx

from kinfer.engines.mlx.step_timer import NoTimer

_PRIMITIVE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


def count_primitives(outputs: list[mx.array]) -> Counter[str]:
    """Primitives in the unevaluated graph behind `outputs`, by name."""
    text = io.StringIO()
    mx.export_to_dot(text, *outputs)
    return Counter(_PRIMITIVE.findall(text.getvalue()))


# primitives that make no kernel: MLX gives the output a view of the input's buffer
VIEWS = frozenset(
    {
        "AsStrided",
        "Broadcast",
        "Depends",
        "ExpandDims",
        "Flatten",
        "Reshape",
        "Slice",
        "Split",
        "Squeeze",
        "Transpose",
        "Unflatten",
    }
)


def kernel_sequence(outputs: list[mx.array]) -> tuple[str, ...]:
    """The primitives of the unevaluated graph behind `outputs` that make kernels, in the order the
    graph lists them: two passes with the same sequence are the same CUDA graphs to MLX's CUDA backend,
    which builds one for each new topology (warm_up.py)."""
    text = io.StringIO()
    mx.export_to_dot(text, *outputs)
    return tuple(name for name in _PRIMITIVE.findall(text.getvalue()) if name not in VIEWS)


class OpCounter(NoTimer):
    """Records every launched pass's primitive counts (`steps`: one Counter per pass; a decode-only step
    launches one)."""

    def __init__(self) -> None:
        self.steps: list[Counter[str]] = []

    def lap(self, phase: str, outputs: list | None = None) -> None:
        if outputs is not None:
            self.steps.append(count_primitives(outputs))

    def clear(self) -> None:
        self.steps.clear()

    def mean(self) -> float:
        return sum(sum(c.values()) for c in self.steps) / len(self.steps) if self.steps else 0.0

    def by_name(self) -> dict[str, float]:
        """Mean count per step of each primitive, most frequent first."""
        total: Counter[str] = Counter()
        for step in self.steps:
            total.update(step)
        n = max(len(self.steps), 1)
        return {name: count / n for name, count in total.most_common()}
