"""The small engine protocol every engine implements, and the values it exchanges.

An engine is owned by one thread (llama contexts and MLX streams are thread-bound): the scheduler
creates it there, calls `submit` when `free_rows > 0`, calls `step` in a loop while `has_work`, and
routes each `JobUpdate` to the request it belongs to. The engine never blocks on a consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Protocol

from kinfer.constrain.spec import Constraint
from kinfer.protocol import FinishReason, Sampling, TokenLogprob

if TYPE_CHECKING:
    import numpy as np

EngineName = Literal["llama.cpp", "mlx"]  # the engines kinfer ships
Pooling = Literal["mean", "cls", "last", "max"]  # how one vector is made of a sequence's token states


@dataclass(frozen=True)
class EmbeddingSpec:
    """How a loaded model embeds text (see kinfer/engines/embedding.py).

    `pooling`: from the model's metadata (GGUF `<arch>.pooling_type`, sentence-transformers'
    1_Pooling/config.json); "last" for a generative model, as Ollama takes the last token's state.
    `max_tokens`: the longest input (special tokens included) one forward pass takes.
    `batch_tokens`: tokens the engine embeds in one pass, over all the inputs it batches.
    `appends_eos`: the tokenizer ends every input with a special token (BERT's [SEP], Qwen3-Embedding's
    <|endoftext|>), which truncation keeps. `matryoshka`: trained so that a prefix of the vector is
    itself an embedding (OpenAI's `dimensions` is accepted only then).
    """

    dimensions: int
    pooling: Pooling
    max_tokens: int
    batch_tokens: int
    vocab_size: int
    appends_eos: bool = False
    matryoshka: bool = False


@dataclass(frozen=True)
class ModelInfo:
    """What the rest of kinfer needs to know about a loaded model."""

    name: str
    engine: EngineName
    architecture: str
    chat_template: str | None
    bos_token: str
    eos_token: str
    context_length: int  # tokens per row (prompt + reply)
    rows: int  # replies decoded together
    recurrent: bool = False  # recurrent/hybrid state: the prefix pool adopts exact checkpoints only
    train_context_length: int = 0
    embedding: EmbeddingSpec | None = None  # None: this engine cannot embed
    chat: bool = True  # False for an embedding model: it embeds, it does not generate


@dataclass(frozen=True)
class GenerationJob:
    """One reply to generate. `max_tokens` already fits the row (the scheduler clips it)."""

    job_id: str
    prompt: tuple[int, ...]
    sampling: Sampling
    max_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # prompt lengths (in tokens) worth saving as exact prefix-pool checkpoints: the end of the system
    # prompt and the end of the conversation before the newest turn (used by recurrent models)
    checkpoints: tuple[int, ...] = ()
    # a grammar the reply must follow (structured output, forced or started tool calls)
    constraint: Constraint | None = None
    # replies to draw from this one prompt (OpenAI's n): the job takes `choices` rows at submit, the
    # prompt is prefilled once in the first, and its KV/state is copied into the others, which then
    # decode on their own (choice i with `choice_sampling(sampling, i)`, each its own grammar)
    choices: int = 1


@dataclass(frozen=True)
class JobUpdate:
    """What one step did for one job. Only jobs that changed appear in a step's list."""

    job_id: str
    text: str = ""  # newly released text; stop strings are held back until they cannot match
    new_tokens: int = 0  # tokens sampled in this step
    prompt_processed: int = 0  # prompt tokens in the row so far, reused ones included
    reused_tokens: int = 0  # prompt tokens adopted from the prefix pool (no recompute)
    # set once the row is freed: "stop", "length", "cancelled", or "error" (a failed forward pass)
    finish: FinishReason | None = None
    stop_string: str | None = None  # the stop string that ended the row (finish == "stop"), if one did
    error: str | None = None  # why the row ended with finish == "error", when the engine can say
    choice: int = 0  # which of the job's choices this row is (each finishes on its own)
    # the logprobs of the tokens sampled in this step (job.sampling.logprobs set); an end-of-generation
    # token has none (it releases no text)
    logprobs: tuple[TokenLogprob, ...] = ()


def choice_sampling(sampling: Sampling, choice: int) -> Sampling:
    """How choice `choice` of a job samples: with a seed, seed + choice (so the choices differ and the
    whole reply repeats); choice 0 is exactly the job's own sampling, as with n = 1."""
    if choice == 0 or sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed + choice) & 0xFFFFFFFF)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and the dashboard; cheap to build once per step."""

    rows_total: int = 0
    rows_busy: int = 0
    tokens_last_step: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    reused_tokens_total: int = 0
    prefix_lookups: int = 0
    prefix_hits: int = 0
    steps_total: int = 0
    # CPU threads llama.cpp's decode steps run on now (the thread tuner's choice; 0: not a CPU count)
    threads: int = 0
    # the memory account (engines/memory_account.py: MemoryAccount.as_dict()), plus "peak" where known and
    # counts that are not bytes (MLX's kv_blocks_used / kv_blocks_total)
    memory: dict[str, int] = field(default_factory=dict)


class Engine(Protocol):
    """A loaded model that batches replies. All methods are called from the engine's own thread."""

    info: ModelInfo

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a rendered prompt: special tokens parsed, BOS added only if the model wants
        one and the text does not already start with it."""
        ...

    def detokenize(self, tokens: list[int]) -> str: ...

    @property
    def free_rows(self) -> int:
        """Rows a new job may take now (a job takes `job.choices` of them)."""
        ...

    @property
    def has_work(self) -> bool:
        """True while any row is prefilling or generating."""
        ...

    def submit(self, job: GenerationJob) -> int:
        """Give the job its rows (one per choice); its prompt is prefilled over the next steps, once.
        Raises if fewer than `job.choices` rows are free.

        Returns how many prompt tokens were adopted from the prefix pool (0 without a hit): the
        split between cached and fresh prompt tokens is known from here on, before any step."""
        ...

    def cancel(self, job_id: str) -> None:
        """Free the job's rows now; the next `step` reports each finished with reason "cancelled"."""
        ...

    def step(self) -> list[JobUpdate]:
        """One forward pass for every active row (plus prompt chunks); returns what changed."""
        ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None:
        """Free the model and its memory."""
        ...


class Embedder(Protocol):
    """An engine that embeds (`info.embedding` is set). `embed` is called from the engine's own
    thread, `embed_tokenize` from preparation threads (it must only read the vocabulary)."""

    info: ModelInfo

    def embed_tokenize(self, text: str) -> list[int]:
        """Token ids of one input with the special tokens the model's embeddings expect (BERT's
        [CLS] ... [SEP], BOS / EOS where the tokenizer adds them)."""
        ...

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """One pooled float32 vector per input (not normalized), all inputs in shared forward passes.
        Each input fits `info.embedding.max_tokens`."""
        ...
