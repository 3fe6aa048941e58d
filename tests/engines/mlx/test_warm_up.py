"""The pass shapes a CUDA engine runs once at load (warm_up.py), so their first sighting (~0.2 s each on
the H200) never stalls streaming replies: every decode row count the buckets can produce, and a long
prompt's one-row chunks. They run on the scratch slot with borrowed KV blocks: the rows served after
must not notice (same greedy tokens as mlx-lm, every block given back)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kinfer.engines.mlx import sdpa_buckets, shape_buckets, warm_up
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.kv import BLOCK
from kinfer.engines.mlx.sdpa_buckets import LONG_CONTEXT_QUERIES
from kinfer.engines.mlx.shape_buckets import bucket, decode_rows
from kinfer.engines.mlx.warm_up import (
    CONTINUED,
    ScratchPass,
    WarmShape,
    run_shape,
    warm_shapes,
    warm_step_ops,
)
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
from tests.engines.mlx.test_engine import QUESTIONS


def test_every_decode_row_count_the_buckets_make_is_warmed_greedy_and_sampled():
    shapes = warm_shapes(64, recurrent=False)
    decode = [s.rows for s in shapes if s.decode and not s.sampled]
    assert decode == sorted({decode_rows(n, 64) for n in range(1, 65)})
    assert decode[:8] == list(range(1, 9)) and decode[-1] == 65  # one stream's sizes, the full batch
    assert [s.rows for s in shapes if s.sampled] == decode  # the draw is a graph of its own
    assert all(s.splits == 1 for s in shapes)


def test_with_the_fused_decode_kernel_every_decode_row_count_is_warmed_split_too():
    # a long row joining the batch splits every row's positions (split_decode.py): a graph of its own
    shapes = warm_shapes(16, recurrent=False, split=True)
    greedy = [s.rows for s in shapes if s.decode and not s.sampled and s.splits == 1]
    assert [s.rows for s in shapes if s.splits > 1] == greedy


def test_a_long_prompts_one_row_chunks_are_warmed_up_to_its_share_beside_decoding():
    lengths = [s.length for s in warm_shapes(16, recurrent=False) if not s.decode]
    assert lengths[0] == 16 and lengths[-1] == 256  # a chunk of the share, its last shorter one
    assert {shape_buckets.bucket(n) for n in range(1, 257)} <= set(lengths)


def test_a_rows_chunks_of_its_share_are_warmed_at_every_key_bucket_it_reaches():
    # cuDNN plans one graph per attention shape: past SHORT_CONTEXT keys each new key bucket met while
    # rows streamed cost a 75-780 ms step on the H200 (sdpa_buckets.py); below it a new key length may
    # change cuBLAS's kernels for the attention's products, a CUDA graph of a new topology
    later = [s for s in warm_shapes(16, recurrent=True, ctx=40960) if s.context > CONTINUED]
    ends = [s.context + s.length for s in later]
    assert all(s.length == LONG_CONTEXT_QUERIES and not s.padded and s.rows == 1 for s in later)
    share = LONG_CONTEXT_QUERIES
    assert [bucket(end) for end in ends] == sorted({bucket(n) for n in range(share + 2, 40961)})
    assert all(end < bucket(end) <= 40960 for end in ends)  # keys padded, as serving's mostly are
    assert all(end % BLOCK == 0 for end in ends if end > SHORT_CONTEXT)  # whole blocks, where buckets allow
    small = [s for s in warm_shapes(16, recurrent=False, ctx=SHORT_CONTEXT) if s.context > CONTINUED]
    assert max(s.context + s.length for s in small) <= SHORT_CONTEXT
    assert [s.context + s.length for s in warm_shapes(4, recurrent=False, ctx=400) if s.context > 1] == [
        319,
        383,
    ]


def test_every_chunk_length_is_warmed_past_position_0_too_in_the_parts_serving_runs_it_in():
    # a chunk past position 0 masks its keys' padding: on the H200 such a chunk's two parts met 10 new
    # CUDA graphs while 16 replies streamed, though its length had been warmed at position 0
    shapes = warm_shapes(16, recurrent=False, split_parts=lambda end: 2)
    at_0 = [s.length for s in shapes if not s.decode and not s.context]
    continued = [s for s in shapes if s.context == CONTINUED]
    assert sorted({s.length for s in continued}) == sorted(set(at_0))
    assert all(s.parts == 2 and bucket(CONTINUED + s.length) > CONTINUED + s.length for s in continued)
    recurrent = [s for s in warm_shapes(16, recurrent=True) if s.context == CONTINUED]
    assert {s.length for s in recurrent if s.padded} == {s.length for s in recurrent if not s.padded}
    assert all(CONTINUED + s.length <= 100 for s in warm_shapes(4, recurrent=False, ctx=100) if s.context)


def trained_longer(path: Path, tmp_path: Path) -> Path:
    """A copy of a tiny model trained for 8,192 positions (their own configs say 4,096)."""
    longer = tmp_path / f"long-{path.name}"
    shutil.copytree(path, longer)
    config = json.loads((longer / "config.json").read_text())
    for part in (config, config.get("text_config", {})):
        part["max_position_embeddings"] = 8192
    (longer / "config.json").write_text(json.dumps(config))
    return longer


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_rows_served_after_a_warm_up_past_the_short_context_read_mlx_lms_tokens(
    arch, tiny_models, tmp_path, make_mlx, padded
):
    path = trained_longer(tiny_models[arch], tmp_path)
    engine = make_mlx(path, rows=3, ctx=6000)
    assert engine._alloc.used == 1  # the long passes' borrowed blocks all given back
    prompts = [engine.tokenize(chat(q)) for q in QUESTIONS[:2]]
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=8) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(path, prompt, 8)[1], i


def test_serving_past_the_short_context_meets_only_attention_shapes_the_warm_up_ran(
    tiny_qwen3, tmp_path, make_mlx, padded, monkeypatch
):
    shapes: set[tuple[int, int]] = set()
    real = sdpa_buckets._sdpa

    def recording(q, k, *rest):
        if k.shape[2] > SHORT_CONTEXT:
            shapes.add((q.shape[2], k.shape[2]))
        return real(q, k, *rest)

    monkeypatch.setattr(sdpa_buckets, "_sdpa", recording)
    make_mlx(trained_longer(tiny_qwen3, tmp_path), rows=2, ctx=6000)
    warmed, shapes = set(shapes), set()
    assert warmed  # the rows reach 6,000 keys: two key buckets past 4,096
    for length in (1, 20, 100, LONG_CONTEXT_QUERIES):  # a long prompt's chunks and its last one
        for context in range(SHORT_CONTEXT + 1, 6001, 97):
            q = mx.zeros((1, 2, length, 16))
            k = v = mx.zeros((1, 2, context, 16))
            sdpa_buckets.bucketed_sdpa(q, k, v, 0.25, mx.ones((1, 1, length, context), dtype=mx.bool_), None)
    assert shapes and shapes <= warmed


def test_a_recurrent_model_warms_its_padded_chunks_too():
    shapes = warm_shapes(16, recurrent=True)
    prefill = [s for s in shapes if not s.decode]
    assert {s.length for s in prefill if s.padded} == {s.length for s in prefill if not s.padded}


def test_the_decode_steps_index_ops_beside_the_pass_run_at_load_in_both_logit_dtypes(monkeypatch):
    # each is a gather or scatter whose CUDA module MLX compiles at first use (3-4 s on the H200): rows
    # fed from last step's tokens reordered or mixed with host tokens, the penalty history, logprobs,
    # a grammar's mask, all on the model's logits and on float32 ones (a logit bias converts them)
    seen: dict[str, list] = {"feed": [], "sample": [], "logprobs": [], "mask": []}

    def spy(name, real, describe):
        def call(*args):
            seen[name].append(describe(*args))
            return real(*args)

        monkeypatch.setattr(warm_up, real.__name__, call)

    spy("feed", warm_up.feed_tokens, lambda last, sources, host: tuple(sources))
    spy("sample", warm_up.sample, lambda logits, batch, counters, history: (logits.dtype, history.dtype))
    spy("mask", warm_up.mask_logits, lambda logits, words: logits.dtype)
    compute = warm_up.LogprobRows.compute

    def logprobs(self, logits, tokens):
        seen["logprobs"].append(logits.dtype)
        return compute(self, logits, tokens)

    monkeypatch.setattr(warm_up.LogprobRows, "compute", logprobs)
    warm_step_ops(mx.bfloat16, 300)
    assert set(seen["feed"]) == {(1, 0), (None, 0)}  # a new order; a host token beside a device one
    assert seen["sample"] == [(mx.bfloat16, mx.int32), (mx.float32, mx.int32)]  # with a penalty history
    assert seen["logprobs"] == seen["mask"] == [mx.bfloat16, mx.float32]


class Recorder:
    """A ScratchPass whose passes are recorded, not run."""

    def __init__(self, slots: int) -> None:
        self.scratch = slots
        self.passes: list[tuple[tuple[int, ...], bool, bool]] = []
        self.splits: list[int] = []
        self.released = 0
        self.pass_ = ScratchPass(slots, self.table, self.release, self.views, self.forward, list)

    def table(self, tokens: int) -> np.ndarray:
        return np.zeros(4, dtype=np.int64)

    def release(self) -> None:
        self.released += 1

    def views(self, layout, state_rows, lengths):
        self.splits.append(layout.min_splits)
        return [state_rows, lengths]

    def forward(self, inputs: mx.array, views: list) -> mx.array:
        state_rows, lengths = views
        on_scratch = bool((state_rows == self.scratch).all())
        self.passes.append((tuple(inputs.shape), on_scratch, lengths is not None))
        return mx.zeros((*inputs.shape, 8))


def test_a_pass_runs_its_shape_on_the_scratch_slot_and_gives_its_blocks_back():
    recorder = Recorder(slots=4)
    for shape in (WarmShape(3, 1), WarmShape(5, 1), WarmShape(1, 32), WarmShape(1, 32, padded=True)):
        run_shape(shape, recorder.pass_)
    # every entry is the scratch slot, whose recurrent state is never kept (state.StateLedger)
    assert recorder.passes == [
        ((3, 1), True, False),
        ((5, 1), True, False),
        ((1, 32), True, False),
        ((1, 32), True, True),
    ]
    assert recorder.released == 4


def test_a_split_or_sampled_decode_pass_runs_as_serving_would_run_it():
    recorder = Recorder(slots=4)
    run_shape(WarmShape(3, 1, splits=2), recorder.pass_)
    run_shape(WarmShape(3, 1, sampled=True), recorder.pass_)
    assert recorder.splits == [2, 1]  # the layout asks the fused kernel for its split path
    assert recorder.released == 2


@pytest.mark.parametrize("model", ["tiny_qwen3", "tiny_qwen35"])
def test_rows_served_after_the_warm_up_read_the_same_tokens_as_mlx_lm(model, request, make_mlx, padded):
    path = request.getfixturevalue(model)
    engine = make_mlx(path, rows=6)
    assert engine._alloc.used == 1  # only the scratch slot's own block: the warm-up gave its blocks back
    prompts = [engine.tokenize(chat(q)) for q in QUESTIONS[:3]]
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=8) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(path, prompt, 8)[1], i


def test_an_engine_whose_rows_hold_fewer_tokens_than_a_chunk_share_warms_what_fits(
    tiny_qwen3, make_mlx, padded
):
    # the share beside decoding rows is 256 tokens; a --ctx of 128 cannot hold a chunk that long
    engine = make_mlx(tiny_qwen3, rows=1, ctx=128)
    assert engine._alloc.used == 1  # loaded, and the warm-up gave its blocks back
    results = run_jobs(engine, [job("p", engine.tokenize(chat("Hi")), max_tokens=4, ignore_eos=True)])
    assert results["p"].new_tokens == 4


def test_the_warm_up_runs_only_where_shapes_are_padded(tiny_qwen3, make_mlx, monkeypatch):
    ran = []
    monkeypatch.setattr("kinfer.engines.mlx.engine.run_warm_up", lambda shapes, *_: ran.append(len(shapes)))
    try:
        shape_buckets.set_enabled(False)  # a CPU or Metal: no buckets, nothing to warm
        make_mlx(tiny_qwen3, rows=4)
        assert ran == []
        shape_buckets.set_enabled(True)  # CUDA
        make_mlx(tiny_qwen3, rows=4)
        make_mlx(tiny_qwen3, rows=4, warm_up=False)
    finally:
        shape_buckets.set_enabled(None)
    # with the ladder's chunks in parts too (prompt_passes.py): a two-layer model's two; rows of 512
    assert ran == [len(warm_shapes(4, recurrent=False, split=True, ctx=512, split_parts=lambda end: 2))]


def test_a_step_launches_each_of_its_passes_on_its_own(tiny_qwen3, make_mlx):
    # one eval per pass: on CUDA a pass evaluated after another would start mid-graph, in graphs the
    # warm-up never made (MlxEngine._launch)
    engine = make_mlx(tiny_qwen3, rows=4)
    launches = []
    launch = engine._launch
    engine._launch = lambda outputs: (launches.append(len(outputs)), launch(outputs))[1]
    short, long = engine.tokenize(chat("Hi")), engine.tokenize(chat("Tell me " + "more " * 40))
    assert len(long) > 2 * len(short)  # chunks of different power-of-two buckets: two passes
    engine.submit(job("short", short, 4))
    engine.submit(job("long", long, 4))
    engine.step()
    assert len(launches) == 2  # the two prompts' passes, nothing decoding yet
    while any(not row.ready for row in engine._rows.values()):
        engine.step()
    launches.clear()
    engine.step()
    assert len(launches) == 1  # both rows decode in one pass


@pytest.mark.parametrize("model", ["tiny_qwen3", "tiny_qwen35"])
def test_rows_coming_and_going_after_the_warm_up_launch_only_pass_graphs_it_built(
    model, request, make_mlx, padded, monkeypatch
):
    # MLX's CUDA backend builds a CUDA graph for every new topology (~2 ms each, several a pass), so a
    # pass the warm-up never built stalls every streaming reply; on a CPU the graphs are the same ops.
    # A recurrent model's steady step reads its rows' state as the last pass left it, and a batch that
    # changed gathers it from one output or more: read apart, so the pass is the same either way.
    path = request.getfixturevalue(model)
    with evals_recorded() as built:
        engine = make_mlx(path, rows=4, ctx=1024)
    monkeypatch.setattr(engine._clock.budget, "timed", False)  # CUDA's fixed share beside decoding rows
    launched = launches_recorded(engine)

    # one at a time, beside decoding rows, each leaving in turn; every row within one KV block (a CPU's
    # portable attention merges rows of different block counts with ops of its own; CUDA: one kernel)
    def arrive(step: int, results) -> None:
        if step in (3, 6, 9):
            prompt = engine.tokenize(chat(f"question {step}"))
            engine.submit(job(f"r{step}", prompt, max_tokens=5 + step, ignore_eos=True))

    results = run_jobs(
        engine, [job("r0", engine.tokenize(chat("Hi")), max_tokens=20, ignore_eos=True)], on_step=arrive
    )
    assert len(results) == 4 and all(r.finish == "length" for r in results.values())
    assert len(launched) > 25
    assert [step for step, kernels in launched if kernels not in built] == []
