"""How many prompt tokens a step may prefill beside decoding rows, so the step keeps to a time budget.

A long prompt prefilled in one step stops every streaming reply for as long as it takes (27 s for
3,000 tokens of the bundled model on a 2-core CPU). Both engines therefore ask `PrefillBudget` how
many prompt tokens the step may take while rows decode: the budget left after the decode pass,
divided by the measured time per prompt token. The speed is learned from the chunks themselves (a
smoothed seconds-per-token, so it follows the slowdown as a prompt's attention grows), a chunk at
most doubles from one step to the next (one fast measurement cannot blow the budget), and every
step prefills at least `MIN_CHUNK` tokens so the prompt always advances. Without decoding rows
nobody waits, and the engine's own token cap applies alone.

The budget is `step_budget_ms` (a Setting); 0 picks it from the batch: `AUTO_FACTOR` times the
measured decode-only step, never under a floor. On a GPU the floor is 50 ms (a fast step would
otherwise cut prompts into chunks too small to run efficiently). On a CPU it is 300 ms: there a
prompt token costs about what a decode step does (prefill is compute-bound too: 25-75 ms a token of
the bundled model on one busy core, the longer the prompt the dearer), so a few decode steps' worth
leaves a long prompt a token or two per step and multiplies its time to first token, while 300 ms
still keeps the streaming replies visibly moving (and under the 0.5 s gap kinfer aims for).

MLX on a CUDA GPU is the exception: there, unless `step_budget_ms` is set, a step learns nothing
(`timed=False`) and prefills a fixed share: with no row decoding, up to the engine's chunk cap (2,048
prompt tokens, a few decode steps' time for a small model); beside decoding rows, UNTIMED_BESIDE_DECODE
tokens times the burst factor below (256-2,048), so a long prompt costs each streaming reply a short
pass per step instead of a 2,048-token one (H200, qwen3.5-0.8b shape, 16 rows decoding, a 50,000-token
prompt: with the cap, gaps of 0.39 s against a median step of 11 ms). Why not learned: on the H200
(qwen3-0.6b shape, 64 prompts of 128 tokens submitted at once, `scripts/bench_mlx_engine.py`):
with the cap alone every row had its first token after 1.0 s (2026-11-29); with the learned budget,
55-62 s, and still 21.6 s after the burst changes below, against mlx-lm's 0.41 s. MLX dispatches a step
before reading the last one back, so its step time says little about one pass, and small chunks of every
size make many different pass shapes (each a new attention plan on MLX's CUDA backend, the likeliest
cost; not profiled yet).

A burst of new requests (64 arriving at once beside a few rows already decoding) is many people
waiting for a first token against few waiting for their next one: while more prompts wait than
rows decode, the target is multiplied by their ratio, at most BURST_MAX (`burst_factor`), so the gap
a decoding row sees stays bounded (BURST_MAX targets) and one waiting prompt beside many decoding
rows (the long-prompt case) keeps the plain target. The MLX engine also measures its chunk's speed
only from chunks near the size it plans (`StepClock`): a prompt's last few tokens cost a whole
pass's fixed overhead, which as a per-token speed would shrink the next chunks to a few tokens, and a
step that took less than its room because no more prompt waited never lowers the base a chunk grows
from (`took`). Before these, 64 requests of 128 tokens at once waited ~130 steps for a first token
on the H200 (TTFT p50 3.2 s); a step trace on a CPU showed why: each waiting prompt prefilled in a
pass of its own, 4-8 tokens a step, one prompt after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO_FACTOR = 2.5  # automatic budget: a step with a prompt chunk takes at most ~2.5 decode steps
AUTO_FLOOR_GPU_S = 0.05  # ... and never less than this on a GPU
AUTO_FLOOR_CPU_S = 0.3  # ... or on a CPU
# small, because on a slow or busy CPU a prompt token can cost 25-75 ms (see above)
FIRST_CHUNK = 8  # prompt tokens before anything is measured (then a chunk grows by GROWTH a step)
MIN_CHUNK = 4  # a prompt advances at least this much per step, however slow the decode pass
GROWTH = 2.0  # a chunk at most doubles from one step to the next
SMOOTHING = 0.5  # weight of the newest measurement
NEARLY_FREE_S = 1e-7  # per prompt token, for a step that took no longer than its decode pass alone
BURST_MAX = 4.0  # while more prompts wait than rows decode, the target grows with their ratio, to this
# ... and untimed (MLX on CUDA), to this: there a prefill step's host cost barely grows with its tokens
# (H200 step logs, 256 streams: 100-190 ms for 256 or 1,024 prompt tokens), so a burst's first tokens
# come sooner in fewer, larger steps: up to the chunk cap (8 x 256 = 2,048)
UNTIMED_BURST_MAX = 8.0
UNTIMED_BESIDE_DECODE = 256  # prompt tokens a step takes beside decoding rows when untimed (x burst)
# untimed, a burst is counted in waiting prompts, not against the rows decoding: in a burst of 256 the
# rows decoding are the burst's own first arrivals, so the ratio fell to 1 once half had started and the
# other half waited at 256 prompt tokens a step, 100-500 ms each (H200, qwen3.5-0.8b shape: TTFT p95
# 20.8 s). One prompt waiting (a long one beside streaming rows) keeps the plain share.
UNTIMED_PROMPTS_PER_SHARE = 2  # waiting prompts per UNTIMED_BESIDE_DECODE share, up to the burst limit


@dataclass
class PrefillBudget:
    """Learns the prefill speed and the decode step time of one engine; sizes its prompt chunks.

    `step_ms`: the target step time while rows decode (0: automatic, see the module doc).
    `max_tokens`: the engine's own cap on prompt tokens per step (llama.cpp's n_batch, MLX's chunk).
    `floor_s`: the least automatic budget (`on` picks it for the device).
    """

    step_ms: float
    max_tokens: int
    floor_s: float = AUTO_FLOOR_GPU_S
    per_token_s: float | None = None  # smoothed seconds per prompt token
    decode_s: float | None = None  # smoothed seconds of a decode pass without prompt chunks
    last_chunk: int = FIRST_CHUNK  # prompt tokens the last step beside decoding rows took
    timed: bool = True  # False: every step may take the engine's cap (MLX on CUDA, see the module doc)

    @classmethod
    def on(cls, step_ms: float, max_tokens: int, *, gpu: bool, timed: bool = True) -> PrefillBudget:
        """The budget of an engine running on a GPU or on the CPU. `timed=False`: unless `step_ms` is
        set, the engine's cap alone (MLX on CUDA)."""
        floor = AUTO_FLOOR_GPU_S if gpu else AUTO_FLOOR_CPU_S
        return cls(step_ms, max_tokens, floor, timed=timed or step_ms > 0)

    @property
    def target_s(self) -> float:
        """The step time aimed at while rows decode."""
        if self.step_ms > 0:
            return self.step_ms / 1000.0
        return max(self.floor_s, AUTO_FACTOR * (self.decode_s or 0.0))

    @property
    def burst_limit(self) -> float:
        """The most a burst may stretch this budget's step target (`burst`)."""
        return BURST_MAX if self.timed else UNTIMED_BURST_MAX

    def burst(self, waiting: int, decoding: int) -> float:
        """This step's multiple of the target while `waiting` prompts wait beside `decoding` rows:
        timed, their ratio (`burst_factor`); untimed, one share per UNTIMED_PROMPTS_PER_SHARE waiting
        prompts, whatever decodes (a step's host cost barely grows with its prompt tokens there)."""
        if self.timed:
            return burst_factor(waiting, decoding)
        if decoding <= 0:
            return 1.0
        return min(self.burst_limit, max(1.0, waiting / UNTIMED_PROMPTS_PER_SHARE))

    def room(
        self,
        cap: int,
        decoding: bool,
        taken: int = 0,
        spent_s: float | None = None,
        burst: float = 1.0,
    ) -> int:
        """Prompt tokens the step's next chunk may take, at most `cap` (the engine's own limit).

        `taken`: prompt tokens this step already took (the first chunk always advances, a later one
        gets only what the budget has left). `spent_s`: time the step already took (llama.cpp times
        its passes); None: the smoothed decode time stands in (MLX dispatches a step ahead).
        `burst`: the target's multiple this step (`burst_factor`)."""
        if not decoding:
            return cap
        if not self.timed:
            return max(0, min(cap, int(UNTIMED_BESIDE_DECODE * burst)) - taken)
        if self.per_token_s is None:
            return min(cap, FIRST_CHUNK) if taken == 0 else 0
        spent = spent_s if spent_s is not None else (self.decode_s or 0.0)
        room = int((self.target_s * burst - spent) / self.per_token_s)
        if taken == 0:
            room = max(MIN_CHUNK, room)
        room = min(room, max(MIN_CHUNK, int(self.last_chunk * GROWTH)) - taken)
        return max(0, min(cap, room))

    def took(self, tokens: int, room: int | None = None) -> None:
        """A step beside decoding rows prefilled `tokens` of the `room` it had (the base of the next
        such step's growth). A step that took less than its room because no more prompt waited says
        nothing about larger chunks, and must not shrink them either: the tail of one prompt would
        otherwise start the next burst of prompts from a few tokens a step."""
        if tokens <= 0:
            return
        if room is not None and tokens < room:
            self.last_chunk = max(self.last_chunk, tokens)
        else:
            self.last_chunk = tokens

    def prefilled(self, tokens: int, seconds: float) -> None:
        """`tokens` prompt tokens took `seconds` (their own pass, or a step's time less its decode)."""
        if tokens <= 0 or seconds <= 0:
            return
        self.per_token_s = _smooth(self.per_token_s, seconds / tokens)

    def decoded(self, seconds: float) -> None:
        """A decode pass without prompt chunks took `seconds`."""
        if seconds > 0:
            self.decode_s = _smooth(self.decode_s, seconds)


def burst_factor(waiting: int, decoding: int) -> float:
    """The step target's multiple while `waiting` prompts wait beside `decoding` rows: 1 while no more
    wait than decode, then their ratio, at most BURST_MAX. A burst of new requests is many people
    waiting for a first token against few waiting for their next one; a longer step for the few
    brings every first token in sooner, and the gap they see stays bounded (BURST_MAX targets)."""
    if decoding <= 0:
        return 1.0
    return min(BURST_MAX, max(1.0, waiting / decoding))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else SMOOTHING * new + (1.0 - SMOOTHING) * old


@dataclass
class StepClock:
    """Times the steps of an engine that dispatches a step before reading the last one back (MLX):
    the time between two steps that read decoded tokens is what a streaming row waits for a token,
    and it is charged to the prompt tokens the earlier step dispatched beside the decode pass."""

    budget: PrefillBudget
    _last: float | None = None
    _prefill: int = 0  # prompt tokens dispatched by the step that ended at `_last`

    def ended(self, now: float, *, read_back: bool, prefill: int) -> None:
        """A step ended at `now`; `read_back`: it read back a decode pass the step before dispatched;
        `prefill`: prompt tokens it dispatched beside its own decode pass."""
        if read_back and self._last is not None:
            seconds = now - self._last
            if not self._prefill:
                self.budget.decoded(seconds)
            elif self._prefill * 2 >= self.budget.last_chunk:
                # not from a prompt's small tail: a pass's fixed cost over a few tokens is no speed.
                # A step quicker than the smoothed decode estimate (a noisy machine) still counts, as
                # nearly free: dropped, the first chunks would stay FIRST_CHUNK until one ran slower
                spent = seconds - (self.budget.decode_s or 0.0)
                self.budget.prefilled(self._prefill, max(spent, NEARLY_FREE_S * self._prefill))
        self._last, self._prefill = now, prefill
