"""Per-reply state of the MLX engine (`Row`) and the host-side tables of the step loop (`StepBatch`).

The step loop runs one step ahead of the host: a row's newest token may still be on the device when the
next step feeds it, so a row tracks three counts: `fed` (tokens whose KV/state the caches hold, in
flight included), `sampled` (tokens drawn, in flight included) and `generated` (tokens the host read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np

from kinfer.constrain.runtime import RowGrammar
from kinfer.engines.base import GenerationJob, JobUpdate
from kinfer.engines.mlx.kv import BLOCK
from kinfer.engines.mlx.logits import LogprobRows, bias_table
from kinfer.engines.mlx.long_context import takes_long_path
from kinfer.engines.mlx.sampling import SamplingBatch, make_batch, resolve_seed
from kinfer.engines.mlx.shape_buckets import MIN_BUCKET, bucket, bucket_floor, decode_rows
from kinfer.engines.stop_strings import StopStringMatcher, Utf8Decoder
from kinfer.errors import InvalidRequest, PromptTooLong
from kinfer.protocol import FinishReason


class Row:
    """One reply in progress, in slot `slot`."""

    __slots__ = (
        "blocks",
        "checkpoints",
        "choice",
        "ctx",
        "decoder",
        "done",
        "fed",
        "generated",
        "grammar",
        "job",
        "matcher",
        "order",
        "piece",
        "prompt_len",
        "reused",
        "sampled",
        "seed",
        "slot",
        "src",
        "tokens",
        "unborn",
    )

    def __init__(
        self,
        slot: int,
        job: GenerationJob,
        order: int,
        ctx: int,
        piece: Callable[[int], bytes],
        choice: int = 0,
    ) -> None:
        self.slot = slot
        self.job = job  # a choice other than 0 carries its own sampling (base.choice_sampling)
        self.choice = choice
        self.unborn = 0  # the job's other choices, forked from this row once its prompt is in
        self.order = order  # submission order: waiting prompts are prefilled first come, first served
        self.ctx = ctx
        self.piece = piece
        self.tokens: list[int] = list(job.prompt)  # prompt + tokens read back so far
        self.prompt_len = len(job.prompt)
        self.fed = 0
        self.sampled = 0
        self.generated = 0
        self.reused = 0
        self.blocks: list[int] = []
        self.src: int | None = None  # where this row's newest token sits in the last decode output
        self.done = False
        self.seed = resolve_seed(job.sampling)
        self.decoder = Utf8Decoder()
        self.matcher = StopStringMatcher(job.stop)
        self.checkpoints = sorted({c for c in job.checkpoints if 0 < c < self.prompt_len})
        self.grammar: RowGrammar | None = None  # the constraint's state, when the job has one

    @property
    def key(self) -> tuple[str, int]:
        return (self.job.job_id, self.choice)

    @property
    def ready(self) -> bool:
        """The prompt is in the cache but for its last token, which the first decode step feeds."""
        return self.fed >= self.prompt_len - 1

    @property
    def can_feed(self) -> bool:
        return self.sampled < self.job.max_tokens and self.fed < self.ctx

    def next_chunk(self) -> int:
        """Prompt tokens the next prefill chunk may take: up to the next checkpoint, at most."""
        end = self.prompt_len - 1
        stop = next((c for c in self.checkpoints if c > self.fed), end)
        return min(stop, end) - self.fed

    def progress_update(self) -> JobUpdate:
        return JobUpdate(
            self.job.job_id, prompt_processed=self.fed, reused_tokens=self.reused, choice=self.choice
        )

    def accept(self, token: int, eos: frozenset[int]) -> JobUpdate:
        """Take one sampled token read back from the device."""
        self.generated += 1
        self.tokens.append(token)
        piece = self.piece(token)
        grammar = self.grammar
        if grammar is not None:
            grammar.accept(token, piece)
        if token in eos and not self.job.ignore_eos:
            return self._drain("", "stop")
        scan = self.matcher.feed(self.decoder.feed(piece))
        if scan.matched is not None:
            return self._update(scan.text, "stop", scan.matched)
        if grammar is not None and grammar.ended:
            # the grammar is complete (or the reply left it): nothing more may follow
            return self._drain(scan.text, "error" if grammar.error else "stop", grammar.error)
        if not self.can_feed and self.sampled == self.generated:
            return self._drain(scan.text, "length")  # max_tokens, or the row is full
        return self._update(scan.text, None)

    def dead_end(self) -> JobUpdate:
        """The final update of a row whose grammar cannot go on."""
        error = self.grammar.error if self.grammar is not None else None
        return replace(self._drain("", "error", error or "the grammar cannot go on"), new_tokens=0)

    def _drain(self, text: str, finish: FinishReason, error: str | None = None) -> JobUpdate:
        """The final update of a reply that ends for another reason than a stop string: everything held
        back is released (unless the last undecoded bytes complete a stop string after all)."""
        tail = self.matcher.feed(self.decoder.flush())
        if tail.matched is not None:
            return self._update(text + tail.text, "stop", tail.matched)
        return self._update(text + tail.text + self.matcher.flush(), finish, error=error)

    def _update(
        self, text: str, finish: FinishReason | None, stop_string: str | None = None, error: str | None = None
    ) -> JobUpdate:
        return JobUpdate(
            self.job.job_id,
            text=text,
            new_tokens=1,
            prompt_processed=self.prompt_len,
            reused_tokens=self.reused,
            finish=finish,
            stop_string=stop_string,
            error=error if finish == "error" else None,
            choice=self.choice,
        )


def check_prompt(prompt: Sequence[int], *, ctx: int, vocab: int) -> None:
    """A prompt a row can take: not empty, within the row's context, every id in the vocabulary."""
    if not prompt:
        raise InvalidRequest("empty prompt")
    if len(prompt) > ctx:
        raise PromptTooLong(
            f"prompt of {len(prompt)} tokens; a row holds {ctx}", prompt_tokens=len(prompt), limit=ctx
        )
    if max(prompt) >= vocab or min(prompt) < 0:
        raise InvalidRequest("prompt has token ids outside the vocabulary")


@dataclass(frozen=True)
class PrefillPass:
    """One prefill pass of a step: `rows` each feed their next `chunks[i]` prompt tokens, right-padded
    to `length` (a padded position's KV is written past the row's prompt and overwritten by its next
    real token; causal attention keeps the row's own tokens from seeing it)."""

    length: int
    rows: list[Row]
    chunks: list[int]

    @property
    def tokens(self) -> int:
        """Positions the pass computes, padding included (what the step pays for)."""
        return self.length * len(self.rows)

    def inputs(self, rows_to: int) -> tuple[np.ndarray, list[list[int]], list[int]]:
        """The pass's slots, token rows (each chunk right-padded with its last token) and chunks, its rows
        padded to `rows_to` with copies of the last one: they write the same K/V and recurrent state to
        the same places, and their outputs are dropped (a few pass shapes on CUDA, shape_buckets)."""
        slots = [r.slot for r in self.rows]
        tokens = [
            [*r.job.prompt[r.fed : r.fed + n], *[r.job.prompt[r.fed + n - 1]] * (self.length - n)]
            for r, n in zip(self.rows, self.chunks, strict=True)
        ]
        extra = rows_to - len(self.rows)
        if extra <= 0:
            return np.array(slots), tokens, list(self.chunks)
        return (
            np.array(slots + slots[-1:] * extra),
            tokens + tokens[-1:] * extra,
            self.chunks + self.chunks[-1:] * extra,
        )


def plan_prefill(
    rows: list[Row], budget: int, *, ladder: bool = False, long_chunk: int | None = None
) -> list[PrefillPass]:
    """This step's prompt chunks within `budget` tokens, first come first served.

    Every pass costs the host a whole forward pass, so waiting prompts share as few passes as they can:
    a row joins the pass of its chunk's power-of-two bucket, right-padded to the longest chunk there
    (under 2x its own: a burst of ~equal prompts is one pass); padding counts against the budget.
    Recurrent layers keep their state at each row's own end (state.StateView.lengths). A row with no
    room left to pad gets an unpadded pass of its own chunk; the row at the budget's edge takes what is
    left, in a pass of its own.
    `ladder` (CUDA, shape_buckets): a padded pass's length is padded on up to the bucket ladder, and a
    chunk cut short by the budget is cut to a ladder size, so passes come in a few shapes; a prompt
    longer than the budget takes its odd piece first (`odd_first`).
    `long_chunk` (CUDA, beside decoding rows): a row whose chunk attends past SHORT_CONTEXT keys takes
    exactly that many tokens (or its whole rest, if shorter), in a pass of its own, or waits a step:
    the warm-up ran that one shape at every key bucket (cuDNN's plan and the compiled pass's trace,
    warm_up.py), and a call there costs the same from 128 to 1,024 queries. A burst's larger share or
    the budget's edge cut it to other lengths, each a first sighting at each key bucket, while the
    burst's own prompts waited behind it: on the H200, replies ending and new ones arriving beside a
    30,000-token prompt (qwen3-0.6b, 16 rows), 20-23 steps over 60 ms (the largest 152-205 ms) before,
    7-9 (86-109 ms) with this."""
    # a pass per key: (power-of-two bucket, True) padded, (chunk, False) unpadded, or a long row's own
    members: dict[tuple, list[tuple[Row, int]]] = {}
    lengths: dict[tuple, int] = {}
    spent = 0

    def cut(room: int) -> int:
        return bucket_floor(room) if ladder else room

    for row in rows:
        whole = row.next_chunk()
        if long_chunk and whole > 0 and takes_long_path(1, row.fed + min(whole, long_chunk)):
            chunk = min(whole, long_chunk)
            if members and spent + chunk > budget:
                continue  # no cut to fit: the next step takes it whole
            spent += chunk
            lengths[chunk, False, row.slot] = chunk
            members[chunk, False, row.slot] = [(row, chunk)]
            continue
        chunk = whole if members or whole <= budget else odd_first(whole, budget) if ladder else budget
        if chunk <= 0:
            continue
        key = (1 << (chunk - 1).bit_length(), True)
        length = max(lengths.get(key, 0), chunk)
        if ladder:
            length = bucket(length)
        if min(r.ctx - r.fed for r, _ in [*members.get(key, []), (row, 0)]) < length:
            key, length = (chunk, False), chunk  # no room left in a row to pad it
        had = len(members.get(key, []))
        cost = length * (had + 1) - lengths.get(key, 0) * had
        if members and spent + cost > budget:
            # the budget's edge: the next row in line takes what is left, in a pass of its own
            left = budget - spent
            if ladder and whole > left < MIN_BUCKET:
                break  # a sliver of a prompt is not worth a pass (each costs the host a whole one)
            chunk = length = cost = whole if whole <= left else cut(left)
            if ladder and chunk > 0 and bucket(chunk) <= min(left, row.ctx - row.fed):
                length = cost = bucket(chunk)  # its whole rest, padded: a ladder shape all the same
            key = (length, False)
            if chunk <= 0:
                break
        spent += cost
        lengths[key] = length
        members.setdefault(key, []).append((row, chunk))
    return [PrefillPass(lengths[k], [r for r, _ in g], [c for _, c in g]) for k, g in members.items()]


def odd_first(whole: int, budget: int) -> int:
    """A prompt's first chunk when its `whole` rest is longer than the step's `budget` (CUDA): the piece
    past a whole number of the largest power of two within the budget, so every later chunk is full.
    Cut from the front, the odd piece was the prompt's last chunk: a padded pass deep in the prompt, a
    shape no warm-up runs (on the H200, beside 16 decoding rows, the last chunk of a 50,000-token
    prompt took 57-89 ms against 32 ms for every full one). At the front it is a fresh row's padded
    chunk, which the warm-up ran at load (warm_up.py); the pacing's shares (halves of the unit) divide
    what is left."""
    unit = 1 << (budget.bit_length() - 1)
    return whole % unit or bucket_floor(budget)


@dataclass(frozen=True)
class DecodePlan:
    """What stays the same while the decode batch keeps the same rows."""

    key: tuple[int, ...]
    slots: np.ndarray  # slot of each entry of the pass: the rows', then the scratch slot as padding
    history_rows: mx.array | None  # the rows' own slots (penalty history); None: every slot in order
    padding: int  # entries past the rows (all the scratch slot): their results are dropped
    sampling: SamplingBatch
    bias: mx.array | None  # [B, V] logit_bias, when some row has one
    logprobs: LogprobRows | None  # the rows that report logprobs, when some row asks


@dataclass(frozen=True)
class Inflight:
    """A dispatched decode step: its tokens on the device, its rows, and the logprobs of the rows that
    asked (`LogprobRows.compute`'s arrays), read back together."""

    tokens: mx.array
    rows: list[Row]
    logprob_rows: LogprobRows | None = None
    logprobs: tuple[mx.array, mx.array, mx.array] | None = None


class StepBatch:
    """Block tables and positions of every slot (numpy, for vectorised layouts), the decode batch's
    cached plan, and the last decode step's device tokens."""

    def __init__(self, rows: int, ctx: int, vocab: int, *, pad: bool = False) -> None:
        """`pad`: decode passes are padded to `shape_buckets.decode_rows` with the scratch slot (index
        `rows`), whose table the engine points at a block of its own."""
        self.rows = rows
        self.vocab = vocab
        self.pad = pad
        slots = rows + 1 if pad else rows
        self._table = np.zeros((slots, (ctx + BLOCK - 1) // BLOCK + 1), dtype=np.int64)
        self._pos = np.zeros(slots, dtype=np.int64)
        self._plan: DecodePlan | None = None
        self._last: mx.array | None = None

    def changed(self) -> None:
        """A row joined or left: rebuild the decode plan."""
        self._plan = None

    def set_table(self, slot: int, blocks: list[int]) -> None:
        self._table[slot, : len(blocks)] = blocks

    def clear_table(self, slot: int) -> None:
        self._table[slot] = 0
        self._pos[slot] = 0

    def set_position(self, slot: int, position: int) -> None:
        self._pos[slot] = position

    def table(self, slots: np.ndarray) -> np.ndarray:
        return self._table[slots]

    def positions(self, slots: np.ndarray) -> np.ndarray:
        return self._pos[slots]

    def plan(self, rows: list[Row]) -> DecodePlan:
        key = tuple(r.order for r in rows)
        if self._plan is None or self._plan.key != key:
            own = np.array([r.slot for r in rows], dtype=np.int64)
            size = decode_rows(len(rows), self.rows) if self.pad else len(rows)
            slots = np.concatenate([own, np.full(size - len(rows), self.rows, dtype=np.int64)])
            samplings = [r.job.sampling for r in rows]
            self._plan = DecodePlan(
                key=key,
                slots=slots,
                history_rows=None if _in_order(own, self.rows) else mx.array(own.astype(np.int32)),
                padding=size - len(rows),
                sampling=make_batch(samplings, [r.seed for r in rows], self.vocab),
                bias=bias_table(samplings, self.vocab),
                logprobs=LogprobRows.of(samplings),
            )
        return self._plan

    def inputs(self, rows: list[Row]) -> mx.array:
        """The token each row feeds: known on the host, or still on the device from the last step."""
        sources = [None if r.fed < len(r.tokens) else r.src for r in rows]
        host = [r.tokens[r.fed] if s is None else 0 for r, s in zip(rows, sources, strict=True)]
        return feed_tokens(self._last, sources, host)

    def dispatched(self, rows: list[Row], tokens: mx.array) -> None:
        for i, row in enumerate(rows):
            if row.done:  # ended while this step was built (a constrained step reads the last one first)
                continue
            row.src = i
            row.fed += 1
            row.sampled += 1
            self._pos[row.slot] = row.fed
        self._last = tokens


def _in_order(slots: np.ndarray, count: int) -> bool:
    """`slots` is every one of `count` slots, in order (the penalty history needs no gather)."""
    return len(slots) == count and bool((slots == np.arange(count)).all())


def feed_tokens(last: mx.array | None, sources: list[int | None], host: list[int]) -> mx.array:
    """Each row's next input: `last[source]` (a token the last step sampled, still on the device) or,
    where its source is None, `host` (a token known on the host)."""
    if last is not None and None not in sources:
        if len(sources) == last.shape[0] and sources == list(range(len(sources))):
            return last
        return last[mx.array(sources)]
    if last is None or all(s is None for s in sources):
        return mx.array(host, dtype=mx.int32)
    # mix: host tokens after the device ones, then pick
    picks = [len(last) + i if s is None else s for i, s in enumerate(sources)]
    merged = mx.concatenate([last.astype(mx.int32), mx.array(host, dtype=mx.int32)])
    return merged[mx.array(picks)]
