"""Per-reply state of the llama.cpp engine: one `Row` per choice of a job, each in its own sequence id."""

from __future__ import annotations

import numpy as np

from kinfer.constrain.runtime import RowGrammar
from kinfer.engines.base import GenerationJob, JobUpdate
from kinfer.engines.llama.samplers import has_penalties
from kinfer.engines.logprobs import bias_arrays
from kinfer.engines.stop_strings import StopStringMatcher, Utf8Decoder
from kinfer.protocol import FinishReason, TokenLogprob

RowKey = tuple[str, int]  # (job id, choice)


class Row:
    """One reply (choice `choice` of its job) in sequence id `seq` (engine-internal)."""

    __slots__ = (
        "argmax_draw",
        "bias",
        "checkpoints",
        "choice",
        "decoder",
        "generated",
        "grammar",
        "job",
        "matcher",
        "order",
        "pending",
        "reserved",
        "reused",
        "sampler",
        "seq",
        "tokens",
    )

    def __init__(self, seq: int, job: GenerationJob, order: int, sampler: int, choice: int = 0) -> None:
        self.seq = seq
        self.job = job
        self.choice = choice
        self.order = order  # submission order: waiting prompts are prefilled first come, first served
        self.sampler = sampler  # this choice's own chain (its own seed: choice_sampling)
        self.tokens: list[int] = []  # exactly the tokens the sequence's memory holds
        self.reused = 0
        self.pending: int | None = None  # the last sampled token, fed to the model at the next step
        self.generated = 0
        self.decoder = Utf8Decoder()
        self.matcher = StopStringMatcher(job.stop)
        self.checkpoints = frozenset(c for c in job.checkpoints if 0 < c < len(job.prompt))
        self.grammar: RowGrammar | None = None  # the constraint's state, when the job has one
        # sequence ids held for the job's other choices until the prompt is in (choice 0 only)
        self.reserved: list[int] = []
        # choices differ only in their seed, so bias and the greedy shortcut are the job's
        self.bias: tuple[np.ndarray, np.ndarray] | None = bias_arrays(job.sampling)
        # greedy with no penalties: the engine takes the argmax itself (RowLogits.draw_greedy)
        self.argmax_draw = job.sampling.greedy and not has_penalties(job.sampling)

    @property
    def key(self) -> RowKey:
        return (self.job.job_id, self.choice)

    @property
    def prefilling(self) -> bool:
        return len(self.tokens) < len(self.job.prompt)

    @property
    def prompt_processed(self) -> int:
        return min(len(self.tokens), len(self.job.prompt))

    @property
    def touches_logits(self) -> bool:
        """The row changes or reads its logits before the draw (bias, grammar mask, logprobs)."""
        grammar = self.grammar
        masked = grammar is not None and (grammar.active or grammar.blocks_eos)
        return masked or self.bias is not None or self.job.sampling.logprobs is not None

    def update(
        self,
        *,
        text: str = "",
        new_tokens: int = 0,
        lp: tuple[TokenLogprob, ...] = (),
        finish: FinishReason | None = None,
        stop_string: str | None = None,
        error: str | None = None,
    ) -> JobUpdate:
        """What a step did for this row (`finish` set: the step ended it)."""
        return JobUpdate(
            job_id=self.job.job_id,
            text=text,
            new_tokens=new_tokens,
            prompt_processed=self.prompt_processed,
            reused_tokens=self.reused,
            finish=finish,
            stop_string=stop_string,
            error=error,
            choice=self.choice,
            logprobs=lp,
        )
