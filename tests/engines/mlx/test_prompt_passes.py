"""A long prompt's chunk beside decoding rows runs through the model's layers a few a step
(prompt_passes.py): the decoding rows take a token every step meanwhile, the chunk's row moves on only
once its last layers ran, a cancel mid-chunk drops it, and every reply still reads mlx-lm's greedy
tokens. CUDA's shape buckets and untimed budget are forced here on a CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kinfer.engines.mlx import prompt_passes
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.compiled_step import CompiledDecoder
from kinfer.engines.mlx.engine import MlxEngine
from kinfer.engines.mlx.hybrid_layers import HybridLayers
from kinfer.engines.mlx.shape_buckets import bucket
from kinfer.engines.mlx.state import StateSlots
from kinfer.engines.mlx.warm_up import warm_shapes
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import (
    chat,
    evals_recorded,
    job,
    launches_recorded,
    mlx_lm_greedy,
    readable,
    run_jobs,
)
from tests.engines.mlx.test_warm_up import trained_longer
from tests.fixtures.tiny_mlx import build_tiny_model

LAYERS = 5


def test_a_chunk_takes_more_parts_the_more_keys_it_attends_to_never_more_than_layers():
    assert prompt_passes.parts(SHORT_CONTEXT + 256, 28) == 2  # keys bucketed to 5,120
    assert prompt_passes.parts(16_000, 28) == 3  # 16,384
    assert prompt_passes.parts(30_000, 28) == 4  # 32,768
    assert prompt_passes.parts(50_000, 28) == 5  # 57,344
    assert prompt_passes.parts(50_000, 3) == 3


@pytest.mark.parametrize(("layers", "count"), [(28, 3), (5, 4), (2, 2), (7, 1)])
def test_the_layer_ranges_are_consecutive_and_cover_every_layer_once(layers, count):
    ranges = prompt_passes.layer_ranges(layers, count)
    assert len(ranges) == count
    assert [i for r in ranges for i in r] == list(range(layers))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_the_warm_up_runs_each_chunk_in_the_parts_serving_will():
    shapes = warm_shapes(4, recurrent=False, ctx=40_960, split_parts=lambda end: 2 + end // 10_000)
    long = [s for s in shapes if s.context]
    assert long and all(s.parts == 2 + (s.context + s.length) // 10_000 for s in long)
    ladder = [s for s in shapes if not s.decode and not s.context]
    whole = {s.length for s in ladder if s.parts == 1}  # a prompt that goes in at once
    assert whole and {s.length for s in ladder if s.parts == 2} == whole


def test_a_recurrent_models_padded_chunks_are_warmed_in_parts_too():
    shapes = warm_shapes(4, recurrent=True, ctx=40_960, split_parts=lambda end: 2 + end // 10_000)
    padded = [s for s in shapes if s.padded]
    at_start = {s.length for s in padded if not s.context and s.parts == 1}  # a prompt's first piece
    assert at_start and {s.length for s in padded if not s.context and s.parts == 2} == at_start
    assert all(s.parts == 2 for s in padded if s.context)  # past position 0: beside decoding rows only


def _deep(arch: str, tmp_path_factory) -> Path:
    """A tiny `arch` model of LAYERS layers, trained for 8,192 positions (qwen3_5: linear layers at
    0, 2 and 4, full attention at 1 and 3)."""
    root = tmp_path_factory.mktemp("deep")
    layers = {"num_hidden_layers": LAYERS}
    config = {"text_config": layers} if arch == "qwen3_5" else layers
    return trained_longer(build_tiny_model(root / arch, arch, config=config), root)


@pytest.fixture
def deep_qwen3(tmp_path_factory) -> Path:
    return _deep("qwen3", tmp_path_factory)


def _untimed(engine: MlxEngine, monkeypatch) -> None:
    monkeypatch.setattr(engine._clock.budget, "timed", False)  # CUDA's fixed share beside decoding rows


def _record_parts(engine: MlxEngine, monkeypatch) -> list[tuple[int, range]]:
    """(step, layers) of every pass that ran only some of the layers."""
    parts: list[tuple[int, range]] = []

    def recording(real):
        def through(self, carry, views, layers):
            if len(layers) < len(views):
                parts.append((engine._counts["steps"] + 1, layers))  # run_jobs counts from 1
            return real(self, carry, views, layers)

        return through

    for layered in (CompiledDecoder, HybridLayers):
        monkeypatch.setattr(layered, "through", recording(layered.through))
    return parts


def _long_prompt(engine: MlxEngine) -> list[int]:
    prompt = engine.tokenize(chat(" ".join(f"item {i}," for i in range(700))))
    assert SHORT_CONTEXT + 512 < len(prompt) < 7000
    return prompt


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen3_5"])
def test_beside_decoding_rows_a_long_chunk_goes_through_a_few_layers_a_step(
    arch, tmp_path_factory, make_mlx, padded, monkeypatch
):
    model = _deep(arch, tmp_path_factory)
    monkeypatch.setattr(prompt_passes, "KEYS_PER_PART", 2048)  # 2-5 parts at these keys, not 2-3
    engine = make_mlx(model, rows=3, ctx=8000, prefill_chunk=2048, warm_up=False)
    _untimed(engine, monkeypatch)
    parts = _record_parts(engine, monkeypatch)
    prompt = _long_prompt(engine)
    streaming = [
        job(f"s{i}", engine.tokenize(chat(f"question {i}")), max_tokens=90, ignore_eos=True) for i in range(2)
    ]
    fed: dict[int, int] = {}  # the long row's prompt position after each step
    tokens: dict[int, int] = {}  # the streaming rows' tokens after each step

    def watch(step: int, results) -> None:
        rows = [r for r in engine._slots if r is not None and r.job.job_id == "long"]
        fed[step] = rows[0].fed if rows else len(prompt)
        tokens[step] = sum(results[s.job_id].new_tokens for s in streaming)

    results = run_jobs(engine, [*streaming, job("long", prompt, max_tokens=6)], on_step=watch)

    assert parts, "no chunk was split"
    split_steps = sorted({step for step, _ in parts})
    chunks: list[list[range]] = [[]]
    for _, layers in parts:  # consecutive ranges from layer 0 to the last, one chunk after the other
        chunks[-1].append(layers)
        if layers[-1] == LAYERS - 1:
            chunks.append([])
    chunks.pop()
    assert chunks and all([i for r in chunk for i in r] == list(range(LAYERS)) for chunk in chunks)
    sizes = [len(chunk) for chunk in chunks]  # every chunk of it, the more keys the more parts
    assert len(chunks) >= 10 and sizes == sorted(sizes) and sizes[-1] > sizes[0] >= 2
    assert len(split_steps) == len(parts)  # one part a step
    for step in split_steps[1:]:  # both streaming rows took a token at every one of those steps
        if tokens.get(step, 0) < 180 and tokens.get(step - 1, 0) < 180:
            assert tokens[step] == tokens[step - 1] + 2, step
    # the row's position moved only when a chunk's last layers ran
    moves = [step for step in sorted(fed) if step > 1 and fed[step] != fed.get(step - 1, 0)]
    last_parts = {step for step, layers in parts if layers[-1] == LAYERS - 1}
    assert last_parts <= set(moves)
    assert not {step for step, layers in parts if layers[-1] != LAYERS - 1} & set(moves)

    assert readable(results["long"].text) == mlx_lm_greedy(model, prompt, 6)[1]
    for s in streaming:
        expected = mlx_lm_greedy(model, s.prompt, s.max_tokens, ignore_eos=True)[1]
        assert readable(results[s.job_id].text) == expected


def _state_after_first_chunk(engine: MlxEngine, prompt: list[int], monkeypatch) -> tuple[int, list]:
    """A long prompt arriving beside a decoding row: the parts its first chunk took, and the row's
    recurrent state once that chunk is in (each array of every recurrent layer)."""
    _untimed(engine, monkeypatch)
    started: list[int] = []
    real = MlxEngine._start_split
    monkeypatch.setattr(
        MlxEngine, "_start_split", lambda self, p, n, u: started.append(n) or real(self, p, n, u)
    )
    long = job("long", prompt, max_tokens=2)
    state: list = []

    def watch(step: int, results) -> None:
        if step == 3:
            engine.submit(long)
        row = next((r for r in engine._slots if r is not None and r.job.job_id == "long"), None)
        if row is not None and row.fed and not state:
            layers = [layer for layer in engine._layers if isinstance(layer, StateSlots)]
            state.extend(np.array(a) for layer in layers for a in layer.snapshot(row.slot) if a is not None)

    streaming = job("s", engine.tokenize(chat("question")), max_tokens=40, ignore_eos=True)
    run_jobs(engine, [streaming], on_step=watch)
    return (started[0] if started else 1), state


def test_a_recurrent_models_padded_chunk_in_parts_keeps_the_state_it_keeps_whole(
    tmp_path_factory, make_mlx, padded, monkeypatch
):
    model = _deep("qwen3_5", tmp_path_factory)
    split = make_mlx(model, rows=3, ctx=8000, prefill_chunk=2048, warm_up=False)
    prompt = _long_prompt(split)
    assert len(prompt) % 256 not in {bucket(len(prompt) % 256), 0}  # its first piece is a padded pass
    parts, in_parts = _state_after_first_chunk(split, prompt, monkeypatch)
    whole = make_mlx(model, rows=3, ctx=8000, prefill_chunk=2048, warm_up=False, layer_split=False)
    one, at_once = _state_after_first_chunk(whole, prompt, monkeypatch)
    assert parts > 1 and one == 1 and len(in_parts) == len(at_once) > 0
    for a, b in zip(in_parts, at_once, strict=True):  # the window and the recurrence, each layer's
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_long_prompt_cancelled_mid_chunk_leaves_the_others_serving(
    deep_qwen3, make_mlx, padded, monkeypatch
):
    # no prefix pool: every block in use after the run would be a row's
    engine = make_mlx(deep_qwen3, rows=2, ctx=8000, prefill_chunk=2048, warm_up=False, prefix_cache=False)
    _untimed(engine, monkeypatch)
    prompt = _long_prompt(engine)
    streaming = job("s", engine.tokenize(chat("question")), max_tokens=60, ignore_eos=True)
    cancelled_at: list[int] = []

    def cancel_mid_chunk(step: int, results) -> None:
        if engine._split is not None and not cancelled_at:
            cancelled_at.append(step)
            engine.cancel("long")

    results = run_jobs(engine, [streaming, job("long", prompt, max_tokens=6)], on_step=cancel_mid_chunk)
    assert cancelled_at and results["long"].finish == "cancelled"
    assert engine._split is None and engine._alloc.used == 1  # its blocks back; the scratch slot's one
    assert readable(results["s"].text) == mlx_lm_greedy(deep_qwen3, streaming.prompt, 60)[1]
    after = job("after", engine.tokenize(chat("and after?")), max_tokens=8)  # the freed slot serves again
    assert readable(run_jobs(engine, [after])["after"].text) == mlx_lm_greedy(deep_qwen3, after.prompt, 8)[1]


def test_switched_off_a_long_chunk_runs_whole(deep_qwen3, make_mlx, padded, monkeypatch):
    engine = make_mlx(deep_qwen3, rows=2, ctx=8000, prefill_chunk=2048, warm_up=False, layer_split=False)
    _untimed(engine, monkeypatch)
    parts = _record_parts(engine, monkeypatch)
    prompt = _long_prompt(engine)
    streaming = job("s", engine.tokenize(chat("question")), max_tokens=40, ignore_eos=True)
    results = run_jobs(engine, [streaming, job("long", prompt, max_tokens=4)])
    assert not parts
    assert readable(results["long"].text) == mlx_lm_greedy(deep_qwen3, prompt, 4)[1]


def test_the_warm_up_runs_the_split_chunks_at_load(deep_qwen3, make_mlx, padded, monkeypatch):
    seen: list[int] = []
    real = MlxEngine._in_parts
    monkeypatch.setattr(MlxEngine, "_in_parts", lambda self, i, v, n: seen.append(n) or real(self, i, v, n))
    engine = make_mlx(deep_qwen3, rows=2, ctx=6000)
    assert seen and all(n == 2 for n in seen)  # keys under 16,384: two parts
    assert engine._alloc.used == 1


def test_a_prompt_that_goes_in_at_once_beside_decoding_rows_keeps_one_pass(
    deep_qwen3, make_mlx, padded, monkeypatch
):
    engine = make_mlx(deep_qwen3, rows=3, ctx=2048, warm_up=False)
    _untimed(engine, monkeypatch)
    parts = _record_parts(engine, monkeypatch)
    streaming = job("s", engine.tokenize(chat("question")), max_tokens=30, ignore_eos=True)
    short = job("short", engine.tokenize(chat(" ".join(f"item {i}," for i in range(20)))), max_tokens=4)
    assert len(short.prompt) < 256  # the step's share beside decoding rows

    def arrive(step: int, results) -> None:
        if step == 5:
            engine.submit(short)

    results = run_jobs(engine, [streaming], on_step=arrive)
    assert not parts and results["short"].finish is not None
    assert readable(results["short"].text) == mlx_lm_greedy(deep_qwen3, short.prompt, 4)[1]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_long_prompts_chunks_in_parts_launch_only_graphs_the_warm_up_built(
    arch, tmp_path_factory, make_mlx, padded, monkeypatch
):
    # each part of each chunk, a padded first piece's too: a graph the warm-up never built stalls every
    # streaming reply on CUDA (~2 ms each to build, several a pass). Up to the prompt's first token: once
    # its long row decodes beside the short one, a CPU's portable attention merges rows of different
    # block counts with ops of its own, where CUDA runs one kernel.
    model = _deep(arch, tmp_path_factory)
    with evals_recorded() as built:
        engine = make_mlx(model, rows=3, ctx=8000, prefill_chunk=2048)
    _untimed(engine, monkeypatch)
    parts = _record_parts(engine, monkeypatch)
    launched = launches_recorded(engine)
    prompt = _long_prompt(engine)
    prompted: list[int] = []  # the step after which the long row's prompt is all in

    def arrive(step: int, results) -> None:
        if step == 3:
            engine.submit(job("long", prompt, max_tokens=4))
        rows = [r for r in engine._slots if r is not None and r.job.job_id == "long"]
        if step > 3 and not prompted and (not rows or rows[0].ready):
            prompted.append(step)

    streaming = job("s", engine.tokenize(chat("Hi")), max_tokens=60, ignore_eos=True)
    run_jobs(engine, [streaming], on_step=arrive)
    assert parts and prompted
    # `launched` counts steps from 0, run_jobs from 1: the launches of steps up to the prompt's last
    assert [step for step, kernels in launched if step < prompted[0] and kernels not in built] == []
