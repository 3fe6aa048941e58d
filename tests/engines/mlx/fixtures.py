"""Fixtures and helpers for the MLX engine tests: tiny random-weight model directories (built once per
session), mlx-lm's own single-sequence greedy decoding as the reference, and a driver that runs jobs
through an engine the way the scheduler does.

Import into a test module with `from tests.engines.mlx.fixtures import *`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import mlx.core as mx
import pytest

from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.engines.mlx.graph_ops import kernel_sequence
from kinfer.engines.mlx.kernels import on_cuda_gpu
from tests.engines.driver import GREEDY, JobResult, job, run_alone, run_jobs
from tests.fixtures.tiny_mlx import build_tiny_model

__all__ = [
    "GREEDY",
    "JobResult",
    "chat",
    "cpu_numerics",
    "job",
    "make_mlx",
    "mlx_lm_greedy",
    "padded",
    "readable",
    "run_alone",
    "run_jobs",
    "tiny_llama",
    "tiny_models",
    "tiny_qwen3",
    "tiny_qwen35",
    "unpadded",
]


def chat(user: str, *, system: str | None = None, history: str = "") -> str:
    """A ChatML prompt for one user turn after `history` (already rendered)."""
    text = f"<|im_start|>system\n{system}<|im_end|>\n" if system and not history else ""
    return text + history + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def readable(text: str) -> str:
    """Text with each run of U+FFFD collapsed to one, and none at the end. Random weights emit invalid
    UTF-8 byte runs, which a streaming decoder and a whole-string decode may split into different
    numbers of replacement characters; a reply that ends inside a character drops the half character
    where a whole-string decode shows U+FFFD. Every valid character must still match exactly."""
    return re.sub("\ufffd+", "\ufffd", text).rstrip("\ufffd")


@cache
def _mlx_lm(path: Path):
    import mlx_lm

    return mlx_lm.load(str(path))


def mlx_lm_greedy(
    path: Path, prompt: Sequence[int], max_tokens: int, *, ignore_eos: bool = False
) -> tuple[list[int], str]:
    """mlx-lm's own single-sequence greedy tokens (stream_generate, argmax sampler) and their text;
    `ignore_eos`: all `max_tokens` of them, past end tokens (as a job with `ignore_eos`)."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = _mlx_lm(Path(path))
    eos = tokenizer._eos_token_ids
    tokenizer._eos_token_ids = set() if ignore_eos else eos
    try:
        tokens = [
            r.token
            for r in stream_generate(
                model, tokenizer, list(prompt), max_tokens=max_tokens, sampler=make_sampler(0.0)
            )
        ]
    finally:
        tokenizer._eos_token_ids = eos
    if ignore_eos:
        return tokens, readable(tokenizer.decode(tokens))
    # stream_generate reports the EOS token that ended generation; the reply does not include it
    if tokens and tokens[-1] in tokenizer.eos_token_ids:
        tokens = tokens[:-1]
    return tokens, readable(tokenizer.decode(tokens))


@contextmanager
def evals_recorded() -> Iterator[set[tuple[str, ...]]]:
    """The kernels of every `mx.eval` inside (graph_ops.kernel_sequence): the graphs the warm-up built,
    around an engine's construction (warm_up.py evaluates each pass on its own)."""
    built: set[tuple[str, ...]] = set()
    real = mx.eval

    def recorded(*args):
        arrays = [a for arg in args for a in (arg if isinstance(arg, list) else [arg])]
        built.add(kernel_sequence([a for a in arrays if isinstance(a, mx.array)]))
        return real(*args)

    mx.eval = recorded
    try:
        yield built
    finally:
        mx.eval = real


def launches_recorded(engine: MlxEngine) -> list[tuple[int, tuple[str, ...]]]:
    """(steps done before it, kernels) of every pass `engine` launches from now on (its `_launch`)."""
    launched: list[tuple[int, tuple[str, ...]]] = []
    launch = engine._launch

    def recorded(outputs: list) -> None:
        launched.append((engine._counts["steps"], kernel_sequence(outputs)))
        launch(outputs)

    engine._launch = recorded  # type: ignore[method-assign]
    return launched


@pytest.fixture
def unpadded() -> Iterator[None]:
    """The shape buckets off, as on a CPU or Metal, whatever this machine is (prompt chunks in any
    length through mlx-lm's module code)."""
    shape_buckets.set_enabled(False)
    yield
    shape_buckets.set_enabled(None)


# A test whose claim rests on this CPU's numbers, not on kinfer's behaviour: on CUDA kinfer's kernels
# (the recurrence, paged attention) and MLX's fused norms and RoPE replace the ops mlx-lm's reference
# and these counts were taken with, and a random tiny model's near-tie logits may flip a greedy token
# (the H200 run of 2026-12-04, docs/benchmarks.md). CI runs them on a CPU.
cpu_numerics = pytest.mark.skipif(
    on_cuda_gpu(), reason="pins the CPU's exact tokens or primitive counts: on CUDA other kernels run"
)


@pytest.fixture
def padded() -> Iterator[None]:
    """The shape buckets on, as on CUDA (decode rows, prompt chunks and key lengths padded)."""
    shape_buckets.set_enabled(True)
    yield
    shape_buckets.set_enabled(None)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-mlx")
    return {arch: build_tiny_model(root / arch, arch) for arch in ("llama", "qwen3", "qwen3_5")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["qwen3"]


@pytest.fixture(scope="session")
def tiny_qwen35(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["qwen3_5"]


@pytest.fixture
def make_mlx() -> Iterator[Callable[..., MlxEngine]]:
    """Builds MlxEngines (4 rows x 512 tokens by default) and closes them after the test."""
    engines: list[MlxEngine] = []

    def make(path: Path, **kw) -> MlxEngine:
        kw.setdefault("rows", 4)
        kw.setdefault("ctx", 512)
        engine = MlxEngine(path, name=Path(path).name, **kw)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
