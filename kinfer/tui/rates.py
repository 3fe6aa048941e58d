"""Aggregate decode and prompt tok/s from successive scheduler snapshots, with a short history.

The scheduler counts tokens of finished requests in its totals and those of live requests in their
rows; their sum only grows, so the difference between two snapshots is the work done in between,
however many requests started or finished meanwhile.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kinfer.scheduler import SchedulerSnapshot

HISTORY = 120  # samples in the sparklines: 30 s at 4 Hz
WINDOW_S = 1.0  # rates average over this much time: a slow model steps less often than we sample


@dataclass(frozen=True)
class TokenCounts:
    """Tokens generated and prompt tokens computed (reused prefix excluded) since the server started."""

    generated: int
    prompt: int


@dataclass(frozen=True)
class Rates:
    """Tokens per second over the last interval."""

    decode: float
    prompt: float


def token_counts(snapshot: SchedulerSnapshot) -> TokenCounts:
    generated = snapshot.generated_tokens_total
    prompt = snapshot.prompt_tokens_total - snapshot.reused_tokens_total
    for request in snapshot.requests:
        if request.finish is None:  # finished rows are already in the totals
            generated += request.generated
            prompt += max(0, request.prompt_processed - request.reused)
    return TokenCounts(generated=generated, prompt=prompt)


class RateTracker:
    """Feed it every snapshot; it keeps the latest rates and a history for the sparklines."""

    def __init__(self, history: int = HISTORY, window: float = WINDOW_S) -> None:
        self.decode_history: deque[float] = deque(maxlen=history)
        self.prompt_history: deque[float] = deque(maxlen=history)
        self.latest = Rates(0.0, 0.0)
        self.window = window
        self._samples: deque[tuple[float, TokenCounts]] = deque()

    def update(self, snapshot: SchedulerSnapshot) -> Rates:
        now = snapshot.taken_at
        if self._samples and now <= self._samples[-1][0]:
            return self.latest  # the same snapshot again (or the clock stepped back)
        self._samples.append((now, token_counts(snapshot)))
        # keep the newest sample at least `window` old as the base of the difference
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        if len(self._samples) < 2:
            return self.latest
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        # clamped: the counts only fall when the scheduler behind the source is a new one
        self.latest = Rates(
            decode=max(0.0, (c1.generated - c0.generated) / (t1 - t0)),
            prompt=max(0.0, (c1.prompt - c0.prompt) / (t1 - t0)),
        )
        self.decode_history.append(self.latest.decode)
        self.prompt_history.append(self.latest.prompt)
        return self.latest
