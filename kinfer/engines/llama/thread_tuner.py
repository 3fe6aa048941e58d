"""How many threads llama.cpp's decode steps run on: a count that follows the machine's load.

ggml's CPU threads meet at a barrier after every op, hundreds of times in a decode step of a small
model. On a quiet machine every core is fastest. When other processes want the cores, the OS
deschedules one of ggml's threads and each barrier waits a time slice for it; one thread has no
barrier to wait at and then wins by far (measured on a 2-core VM with a busy process per core: a
one-row step took ~120 ms on 2 threads, ~30 ms on 1). No fixed count is right for both, so the
engine asks this controller before each decode step and tells it how the step went. Neither count
stays best under contention either: beside two busy processes on two cores one thread gets about
two thirds of a core, while two threads swing between a stall at every barrier and, when the OS
happens to run them together, a whole core's worth (one row, same VM: 3-34 tok/s on two threads,
20-27 on one). So the tuner keeps probing the other counts while contended too.

It runs at the current count and keeps that count's recent step times per batch size (a step's time
depends on the rows in it, so only steps of equal size are compared). Every `probe_every_s` seconds
of decoding it runs `probe_steps` steps at another candidate and compares them with the current
count's median at the same batch size (the first probe once `window` steps say how the start runs:
busy from the start, eight slow steps before the switch). A probe that wins by more than `margin` is
confirmed by a second one before the switch (so noise does not flap), unless it halved the time; a
probe that loses doubles the wait before the next one, up to `max_backoff` times, and two probe
steps in a row `EARLY_LOSS` times slower end it at once (one alone can be a hiccup: on a 2-core VM
with a little load two threads had single 60-120 ms steps among 16 ms ones). On a quiet 2-core
machine probes then run ~1.5 % of the decode time on the slower count (scripted timings,
tests/engines/llama/test_thread_tuner.py).

Between probes it watches the current count. When each of its last `watch` steps (4) took
`EARLY_LOSS` times its baseline (contention began), the next probe comes at once (busy from quiet:
four slow steps, then the switch). When the engine thread's CPU time over wall time in each of those
steps left its settled level by `LOAD_SHIFT` (1.0 while the thread has its core; 0.35-0.75 on one
thread beside busy processes, measured), the contention began or ended: the next probe comes a
quarter interval after the last (back to every thread ~0.2 s of decoding after the busy processes
stop, instead of up to one backed-off interval). When the median of its last `window` steps moved by
more than `shift` either way, the next probe comes one interval after the last. Pure logic: no
clock, no llama.cpp; time is the decode seconds it is fed.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PROBE_EVERY_S = 2.0  # decode seconds between probes, before backoff
PROBE_STEPS = 4  # steps run at a probed count
MARGIN = 0.15  # a count must be this much faster (step time ratio below 1 / 1.15) to win
CONFIRMATIONS = 2  # winning probes in a row before the switch
MAX_BACKOFF = 4  # the probe interval grows up to this many times while probes lose
WINDOW = 8  # recent step times kept per batch size at the current count
MIN_REFERENCE = 3  # steps at a batch size before a probe may compare against them
SHIFT = 1.5  # the current count's steps this much slower or faster than at the last probe: probe soon
EARLY_LOSS = 2.0  # two probe steps in a row this many times slower end the probe (2 threads, busy: ~4x)
LOAD_SHIFT = 0.25  # the engine thread's CPU share of a step moved this much: contention began or ended
LOAD_GAP = 0.25  # ...then probe, no sooner than this share of an interval after the last probe


def candidate_counts(threads: int) -> tuple[int, ...]:
    """The counts worth trying on `threads` cores: all of them first, half on larger machines, one."""
    counts = [threads]
    if threads >= 4:
        counts.append(threads // 2)
    if threads > 1:
        counts.append(1)
    return tuple(counts)


@dataclass(frozen=True)
class TunerConfig:
    """The counts the tuner chooses among (the first is where it starts) and how it probes."""

    candidates: tuple[int, ...]
    probe_every_s: float = PROBE_EVERY_S
    probe_steps: int = PROBE_STEPS
    margin: float = MARGIN
    confirmations: int = CONFIRMATIONS
    max_backoff: int = MAX_BACKOFF
    window: int = WINDOW
    shift: float = SHIFT

    def __post_init__(self) -> None:
        if len(set(self.candidates)) < 2 or min(self.candidates) < 1:
            raise ValueError(f"a tuner needs two or more distinct positive counts, not {self.candidates}")
        if self.probe_steps < 1 or self.window < MIN_REFERENCE or self.confirmations < 1:
            raise ValueError("probe_steps and confirmations must be >= 1, window >= 3")

    @property
    def watch(self) -> int:
        """Steps that must all have moved before the tuner calls it a change (and a reference)."""
        return max(self.probe_steps, MIN_REFERENCE)

    @classmethod
    def for_threads(cls, threads: int) -> TunerConfig | None:
        """The default tuning over `threads` cores (None: a single core leaves nothing to choose)."""
        counts = candidate_counts(threads)
        return cls(counts) if len(counts) > 1 else None


@dataclass(frozen=True)
class Switch:
    """The tuner changed its count: `ratio` is the new count's step time over the old one's."""

    before: int
    after: int
    ratio: float


@dataclass
class _Probe:
    threads: int
    steps: int = 0
    slow_run: int = 0  # clearly slower steps in a row (one alone can be a hiccup of the machine)
    ratios: list[float] = field(default_factory=list)  # probe step time / reference, equal batch size
    samples: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds)


class ThreadTuner:
    """Chooses the thread count of the next decode step from how the last ones went."""

    def __init__(self, config: TunerConfig) -> None:
        self.config = config
        self.current = config.candidates[0]
        self.probes = 0  # probes run (for tests and logs)
        self.switches = 0
        self._recent: dict[int, deque[float]] = {}  # batch tokens -> recent step seconds, current count
        self._clock = 0.0  # decode seconds recorded so far
        self._next_probe = 0.0  # the first probe once `window` steps say how the start runs
        self._backoff = 1
        self._probe: _Probe | None = None
        self._wins = 0
        self._turn = 0  # which of the other candidates the next probe tries
        self._since_probe = 0  # steps at the current count since the last probe ended
        self._probe_ended = 0.0  # the clock when it did
        # per batch size: the reference the last probe compared against (or the first full window's
        # median), and how many steps came since it was taken
        self._baseline: dict[int, float] = {}
        self._since_base: dict[int, int] = {}
        # the engine thread's CPU time over wall time in the current count's last steps, and its level
        # when it last settled: 1.0 while nothing else wants the core, below when the OS shares it out
        self._loads: deque[float] = deque(maxlen=config.watch)
        self._load_base: float | None = None

    @property
    def threads(self) -> int:
        """The count the next decode step should run on (a probed one while probing)."""
        return self._probe.threads if self._probe is not None else self.current

    def record(
        self, threads: int, tokens: int, seconds: float, cpu_seconds: float | None = None
    ) -> Switch | None:
        """One decode step ran `tokens` tokens on `threads` threads in `seconds` (wall), the calling
        thread using `cpu_seconds` of CPU (None: not known); returns the switch this caused, if any."""
        self._clock += seconds
        if self._probe is not None and threads == self._probe.threads:
            return self._probed(tokens, seconds)
        if threads != self.current:
            return None  # not a count this tuner asked for: nothing to learn from it
        recent = self._recent.setdefault(tokens, deque(maxlen=self.config.window))
        recent.append(seconds)
        self._since_probe += 1
        self._since_base[tokens] = self._since_base.get(tokens, 0) + 1
        if tokens not in self._baseline and len(recent) == self.config.window:
            self._baseline[tokens], self._since_base[tokens] = statistics.median(recent), 0
        shift = self._shift(tokens)
        if self._load_moved(seconds, cpu_seconds):
            self._restart(tokens, self._probe_ended + self.config.probe_every_s * LOAD_GAP)
        elif shift >= self.config.shift:
            # at once when the steps moved a lot (contention began), else no sooner than an interval
            # after the last probe (noise must not buy probes)
            big = shift >= EARLY_LOSS
            self._restart(tokens, self._clock if big else self._probe_ended + self.config.probe_every_s)
        if (
            self._probe is None
            and self._clock >= self._next_probe
            and self._since_probe >= (self.config.probe_steps if self.probes else self.config.window)
            and len(recent) >= MIN_REFERENCE
        ):
            others = [c for c in self.config.candidates if c != self.current]
            self._probe = _Probe(others[self._turn % len(others)])
            self.probes += 1
        return None

    def _restart(self, tokens: int, probe_at: float) -> None:
        """The machine changed: the older steps no longer say how this count runs, the next probe
        compares with the new ones."""
        fresh = list(self._recent[tokens])[-self.config.watch :]
        self._recent = {tokens: deque(fresh, maxlen=self.config.window)}
        self._next_probe = min(self._next_probe, probe_at)
        self._backoff = 1
        self._set_baseline({})

    def _load_moved(self, seconds: float, cpu_seconds: float | None) -> bool:
        """Has every one of the last `watch` steps' CPU share left its settled level?"""
        if cpu_seconds is None or seconds <= 0:
            return False
        loads = self._loads
        loads.append(min(1.0, cpu_seconds / seconds))
        if len(loads) < self.config.watch:
            return False
        if self._load_base is None:
            self._load_base = statistics.median(loads)
            return False
        if min(loads) - self._load_base < LOAD_SHIFT and self._load_base - max(loads) < LOAD_SHIFT:
            return False
        self._load_base = None  # settles again on the next steps
        loads.clear()
        return True

    def _reference(self, tokens: int) -> float | None:
        recent = self._recent.get(tokens)
        if recent is None or len(recent) < MIN_REFERENCE:
            return None
        return statistics.median(recent)

    def _set_baseline(self, baseline: dict[int, float]) -> None:
        self._baseline = baseline
        self._since_base = {tokens: 0 for tokens in baseline}

    def _shift(self, tokens: int) -> float:
        """How far (a factor >= 1) the current count's steps at this size have moved from its baseline:
        each of the last `watch` steps for a large move, the last `window` steps' median for a
        smaller one (1.0: no baseline, or too few steps since it to say)."""
        base = self._baseline.get(tokens)
        recent = list(self._recent.get(tokens, ()))
        fresh = recent[max(0, len(recent) - self._since_base.get(tokens, 0)) :]
        if base is None or len(fresh) < self.config.watch:
            return 1.0
        last = fresh[-self.config.watch :]
        quick = max(min(last) / base, base / max(last))  # every one of them moved (a spike is not)
        if quick >= EARLY_LOSS:
            return quick
        if len(fresh) < self.config.window:
            return 1.0
        steady = statistics.median(fresh) / base
        return max(steady, 1 / steady)

    def _probed(self, tokens: int, seconds: float) -> Switch | None:
        probe = self._probe
        assert probe is not None
        probe.steps += 1
        probe.samples.append((tokens, seconds))
        reference = self._reference(tokens)
        if reference is not None:
            probe.ratios.append(seconds / reference)
        clearly_slower = reference is not None and seconds > EARLY_LOSS * reference
        probe.slow_run = probe.slow_run + 1 if clearly_slower else 0
        if probe.steps < self.config.probe_steps and probe.slow_run < 2:
            return None
        self._probe = None
        self._since_probe, self._probe_ended = 0, self._clock
        if len(probe.ratios) * 2 < probe.steps:  # the batch size changed under the probe: try again later
            self._next_probe = self._clock + self.config.probe_every_s
            return None
        ratio = statistics.median(probe.ratios)
        if ratio * (1 + self.config.margin) < 1:
            self._wins += 1
            # a win by half the time needs no confirmation: noise does not halve a median of steps
            if self._wins >= self.config.confirmations or ratio * EARLY_LOSS <= 1:
                return self._switch(probe, ratio)
            self._next_probe = self._clock  # confirm once the current count has fresh steps
            return None
        self._wins = 0
        self._turn += 1
        self._backoff = min(self._backoff * 2, self.config.max_backoff)
        self._next_probe = self._clock + self.config.probe_every_s * self._backoff
        self._set_baseline({t: ref for t in {t for t, _ in probe.samples} if (ref := self._reference(t))})
        return None

    def _switch(self, probe: _Probe, ratio: float) -> Switch:
        before, self.current = self.current, probe.threads
        self.switches += 1
        self._wins, self._turn, self._backoff = 0, 0, 1
        self._recent = {}
        for tokens, seconds in probe.samples:  # the probe's steps are the new count's first reference
            self._recent.setdefault(tokens, deque(maxlen=self.config.window)).append(seconds)
        self._set_baseline({t: statistics.median(times) for t, times in self._recent.items()})
        self._loads.clear()  # the new count's load settles on its own steps
        self._load_base = None
        self._next_probe = self._clock + self.config.probe_every_s
        return Switch(before, probe.threads, round(ratio, 3))
