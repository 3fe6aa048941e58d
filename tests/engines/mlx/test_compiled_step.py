"""The compiled decode pass (compiled_step.py): llama-style models decode through a few mx.compile'd
functions around kinfer's paged attention, and reply exactly as through mlx-lm's module code.

The test suite turns mx.compile off (MLX_DISABLE_COMPILE=1 in tests/conftest.py: its g++ builds cost
seconds per process); the `compiling` fixture turns it back on, so these tests trace and replay for
real. Without it the compiled pass runs its Python eagerly, which the rest of the suite exercises.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import mlx.core as mx
import pytest

from kinfer.engines.mlx.graph_ops import OpCounter
from kinfer.errors import EngineFailure
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, cpu_numerics, job, run_alone, run_jobs
from tests.fixtures.tiny_mlx import build_tiny_model

QUESTIONS = ("Name a colour.", "Tell me a story about a cat and a long road home.", "What is 2 + 3?")


@pytest.fixture
def compiling() -> Iterator[None]:
    mx.enable_compile()
    yield
    if os.environ.get("MLX_DISABLE_COMPILE"):
        mx.disable_compile()


def _jobs(engine) -> list:
    prompts = [engine.tokenize(chat(q)) for q in QUESTIONS]
    return [job(f"j{i}", p, max_tokens=14, ignore_eos=True) for i, p in enumerate(prompts)] + [
        job("n", prompts[1], max_tokens=10, choices=2)  # a forked choice decodes beside its origin
    ]


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory):
    """Qwen2: llama's layers with biased q/k/v projections."""
    return build_tiny_model(
        tmp_path_factory.mktemp("qwen2") / "qwen2", "llama", config={"model_type": "qwen2"}
    )


@pytest.mark.parametrize("fuse", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_compiled_replies_equal_the_module_codes_batched_and_alone(
    arch, fuse, tiny_models, tiny_qwen2, make_mlx, compiling
):
    path = tiny_qwen2 if arch == "qwen2" else tiny_models[arch]
    compiled = make_mlx(path, fuse_projections=fuse)
    plain = make_mlx(path, fuse_projections=fuse, compiled_step=False)
    assert compiled._decoder is not None and plain._decoder is None

    jobs = _jobs(compiled)
    batched = run_jobs(compiled, jobs)
    reference = run_jobs(plain, jobs)

    assert {k: r.text for k, r in batched.items()} == {k: r.text for k, r in reference.items()}
    assert batched["n"].text == batched["n#1"].text
    for one in jobs[:3]:
        assert run_alone(compiled, one).text == batched[one.job_id].text


def test_a_prompt_adopted_from_the_prefix_pool_decodes_alike(tiny_qwen3, make_mlx, compiling):
    engine = make_mlx(tiny_qwen3)
    prompt = engine.tokenize(chat("Tell me a story about a cat and a long road home."))
    first = run_alone(engine, job("a", prompt, max_tokens=12))
    again = run_alone(engine, job("b", prompt, max_tokens=12))
    assert again.reused_tokens > 0
    assert again.text == first.text


def _mean_primitives(engine) -> float:
    counter = OpCounter()
    engine.step_timer = counter
    run_jobs(engine, _jobs(engine)[:2])
    return counter.mean()


@cpu_numerics  # on CUDA norms and RoPE are one primitive either way: the H200's counts are in the docs
def test_compiling_is_what_cuts_the_primitives_per_step(tiny_qwen3, make_mlx, compiling):
    compiled = _mean_primitives(make_mlx(tiny_qwen3))
    plain = _mean_primitives(make_mlx(tiny_qwen3, compiled_step=False))
    mx.disable_compile()
    try:  # the same kinfer code run eagerly: the graph mx.compile fuses and simplifies
        eager = _mean_primitives(make_mlx(tiny_qwen3))
    finally:
        mx.enable_compile()
    assert compiled < 0.8 * plain
    assert compiled < 0.8 * eager


def test_smollm2_in_float32_replies_alike_compiled(smollm_f32, make_mlx, compiling):
    compiled = make_mlx(smollm_f32.hf_dir, rows=2)
    plain = make_mlx(smollm_f32.hf_dir, rows=2, compiled_step=False)
    assert compiled._decoder is not None
    prompts = [compiled.tokenize(chat(q)) for q in QUESTIONS[:2]]
    jobs = [job(f"s{i}", p, max_tokens=12) for i, p in enumerate(prompts)]
    got, want = run_jobs(compiled, jobs), run_jobs(plain, jobs)
    assert [got[j.job_id].text for j in jobs] == [want[j.job_id].text for j in jobs]
    assert all(got[j.job_id].new_tokens > 0 for j in jobs)


@pytest.mark.parametrize("fuse", [False, True], ids=["separate", "fused"])
def test_qwen35_layers_decode_through_compiled_sides_alike(
    fuse, tiny_qwen35, make_mlx, compiling, monkeypatch
):
    from kinfer.engines.mlx import compiled_gated_attn, compiled_gdn, compiled_layers

    compiled_passes = {"linear": [], "attention": []}  # one-token passes that took compiled functions

    def spy(kind, real):
        def call(*args):
            out = real(*args)
            compiled_passes[kind].append(out is not None)
            return out

        return call

    monkeypatch.setattr(compiled_layers, "linear_decode", spy("linear", compiled_gdn.linear_decode))
    attention = spy("attention", compiled_gated_attn.attention_decode)
    monkeypatch.setattr(compiled_layers, "attention_decode", attention)
    compiled = make_mlx(tiny_qwen35, fuse_projections=fuse)
    plain = make_mlx(tiny_qwen35, fuse_projections=fuse, compiled_step=False)
    # GatedDeltaNet layers: no whole compiled pass, but each layer's one-token pass (compiled_layers.py):
    # its GatedDeltaNet (compiled_gdn.py) or gated attention (compiled_gated_attn.py) around the
    # recurrence or the paged attention, then its feed-forward side
    assert compiled._decoder is None
    assert all(type(layer).__name__ == "CompiledDecoderLayer" for layer in compiled._model.layers)
    assert not any(type(layer).__name__ == "CompiledDecoderLayer" for layer in plain._model.layers)

    jobs = _jobs(compiled)
    batched = run_jobs(compiled, jobs)

    assert {k: r.text for k, r in batched.items()} == {k: r.text for k, r in run_jobs(plain, jobs).items()}
    assert run_alone(compiled, jobs[1]).text == batched[jobs[1].job_id].text
    assert any(compiled_passes["linear"]) and any(compiled_passes["attention"])


def test_models_of_other_patterns_keep_the_module_code(tmp_path, make_mlx):
    sliding = build_tiny_model(
        tmp_path / "swa",
        "llama",
        config={"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 24},
    )
    assert make_mlx(sliding)._decoder is None


def test_a_compiled_step_that_fails_the_load_check_gives_way_to_the_module_code(
    tiny_qwen3, make_mlx, monkeypatch
):
    from kinfer.engines.mlx.compiled_step import CompiledDecoder

    plain = make_mlx(tiny_qwen3, compiled_step=False)
    monkeypatch.setattr(CompiledDecoder, "__call__", lambda self, inputs, views: mx.zeros((1, 1, 8)))
    engine = make_mlx(tiny_qwen3)  # loads: the check caught the wrong logits
    assert engine._decoder is None
    jobs = _jobs(engine)[:1]
    assert run_jobs(engine, jobs)["j0"].text == run_jobs(plain, jobs)["j0"].text


@pytest.mark.parametrize("bias", [False, True])
def test_a_quantized_projection_gives_the_modules_own_product(bias):
    import mlx.nn as nn

    from kinfer.engines.mlx.compiled_step import Projection

    mx.random.seed(5)
    linear = nn.Linear(64, 48, bias=bias)
    quantized = nn.QuantizedLinear.from_linear(linear, group_size=32, bits=4)
    x, c = mx.random.normal((3, 1, 64)), mx.random.normal((3, 1, 48))
    for module in (linear, quantized):
        projection = Projection.of(module)
        assert projection is not None
        arrays = Projection.arrays(module)
        assert mx.array_equal(projection(x, arrays), module(x)).item()
        assert mx.allclose(projection.add_to(c, x, arrays), c + module(x), atol=1e-5).item()


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_steady_decode_step_replays_its_traces_without_running_the_layers_python(
    arch, tiny_models, make_mlx, compiling, monkeypatch
):
    engine = make_mlx(tiny_models[arch], rows=2, prefix_cache=False)
    prompt = engine.tokenize(chat(QUESTIONS[1]))
    for i in range(2):
        engine.submit(job(f"r{i}", prompt, max_tokens=40, ignore_eos=True))
    for _ in range(8):  # the prompts in, two rows decoding, every function traced at two rows
        engine.step()
    norms = []
    real = mx.fast.rms_norm
    monkeypatch.setattr(mx.fast, "rms_norm", lambda *a, **kw: norms.append(1) or real(*a, **kw))

    for _ in range(4):
        assert engine.step()  # tokens keep coming

    # every layer's norms sit inside compiled functions: replayed, never called from Python (Qwen3.5
    # compiles its layers only: its final norm is mlx-lm's code, once a step)
    assert len(norms) == {"qwen3": 0, "qwen3_5": 4}[arch]


def _texts(results: dict) -> dict[str, str]:
    return {key: result.text for key, result in results.items()}


def _spied_passes(monkeypatch) -> dict[str, list[tuple[int, int]]]:
    """(rows, tokens) of each pass the compiled GatedDeltaNet ("linear") and gated attention took."""
    from kinfer.engines.mlx import compiled_gated_attn, compiled_gdn, compiled_layers

    passes: dict[str, list[tuple[int, int]]] = {"linear": [], "attention": []}

    def spy(kind, real):
        def call(layer, x, cache, side):
            out = real(layer, x, cache, side)
            if out is not None:
                passes[kind].append(x.shape[:2])  # (rows, tokens)
            return out

        return call

    monkeypatch.setattr(compiled_layers, "linear_decode", spy("linear", compiled_gdn.linear_decode))
    monkeypatch.setattr(
        compiled_layers, "attention_decode", spy("attention", compiled_gated_attn.attention_decode)
    )
    return passes


def _with_twins(engine, monkeypatch) -> tuple[list, list[tuple[int, int]]]:
    """`_jobs` plus two short prompts of one length (they prefill together: a pass of several rows),
    and where the (rows, tokens) of every pass this engine runs will be recorded."""
    short = engine.tokenize(chat("Hi"))
    twins = [job(f"t{i}", (*short[:-3], 40 + i, *short[-2:]), max_tokens=6) for i in range(2)]
    every: list[tuple[int, int]] = []
    forward = type(engine).forward

    def spy(self, inputs, views):
        if self is engine:
            every.append(inputs.shape)
        return forward(self, inputs, views)

    monkeypatch.setattr(type(engine), "forward", spy)
    return [*twins, *_jobs(engine)], every  # the twins first: they share the first step


def test_qwen35_prompt_chunks_take_the_compiled_layers_where_shapes_are_bucketed(
    tiny_qwen35, make_mlx, compiling, monkeypatch
):
    # on CUDA pass shapes come from a few buckets (shape_buckets.py) and the warm-up traces one row's:
    # one row's prompt chunk goes through the compiled functions (a GatedDeltaNet's padded pass, whose
    # row ends early, keeps the module code's masked graph), and the replies stay the module code's
    from kinfer.engines.mlx import shape_buckets

    passes = _spied_passes(monkeypatch)
    shape_buckets.set_enabled(True)
    try:
        compiled = make_mlx(tiny_qwen35, prefill_chunk=32)  # long prompts in 32-token chunks
        plain = make_mlx(tiny_qwen35, prefill_chunk=32, compiled_step=False)
        jobs, every = _with_twins(compiled, monkeypatch)
        for seen in passes.values():
            seen.clear()  # the warm-up's passes aside
        batched = run_jobs(compiled, jobs)
        assert _texts(batched) == _texts(run_jobs(plain, jobs))
        assert run_alone(compiled, jobs[3]).text == batched[jobs[3].job_id].text
    finally:
        shape_buckets.set_enabled(None)
    for kind in ("linear", "attention"):
        chunks = {shape for shape in passes[kind] if shape[1] > 1}
        assert (1, 32) in chunks and {rows for rows, _ in chunks} == {1}, kind  # several rows: module code
        assert any(tokens == 1 and rows > 1 for rows, tokens in passes[kind])  # decode, batched
    assert any(rows > 1 and tokens > 1 for rows, tokens in every)  # the twins' chunks, together


def test_without_buckets_prompt_chunks_keep_the_module_code(
    tiny_qwen35, make_mlx, compiling, unpadded, monkeypatch
):
    # on a CPU or Metal prompt chunks come in any length: a trace each would cost more than it saves
    passes = _spied_passes(monkeypatch)
    engine = make_mlx(tiny_qwen35, prefill_chunk=16)
    run_jobs(engine, _jobs(engine)[:2])
    assert passes["linear"] and all(tokens == 1 for _, tokens in passes["linear"] + passes["attention"])


def test_a_prompt_on_mlx_lms_own_caches_keeps_its_module_code(tiny_qwen35, make_mlx, compiling, monkeypatch):
    # the load-time check (check.py) compares kinfer's caches with mlx-lm's forward pass: that reference
    # stays mlx-lm's code whole, buckets or not
    from mlx_lm.models import qwen3_5
    from mlx_lm.models.cache import make_prompt_cache

    from kinfer.engines.mlx import shape_buckets

    module_code = qwen3_5.DecoderLayer.__call__
    whole: list[int] = []  # tokens of each layer pass mlx-lm's own code ran

    def spy(self, x, mask=None, cache=None):
        whole.append(x.shape[1])
        return module_code(self, x, mask, cache)

    monkeypatch.setattr(qwen3_5.DecoderLayer, "__call__", spy)
    shape_buckets.set_enabled(True)
    try:
        model = make_mlx(tiny_qwen35)._model
        whole.clear()
        mx.eval(model(mx.array([[3, 10, 17, 24, 31, 38]]), cache=make_prompt_cache(model)))
    finally:
        shape_buckets.set_enabled(None)
    assert whole == [6] * len(model.layers)


def test_llama_style_prompt_chunks_take_the_compiled_pass_where_shapes_are_bucketed(
    tiny_models, make_mlx, compiling, monkeypatch
):
    # the whole compiled pass (compiled_step.py) also runs prompt chunks where shapes come from CUDA's
    # buckets; the replies stay the module code's
    from kinfer.engines.mlx import shape_buckets
    from kinfer.engines.mlx.compiled_step import CompiledDecoder

    shapes: list[tuple[int, int]] = []  # (rows, tokens) of each pass the compiled decoder ran
    real = CompiledDecoder.__call__

    def spy(self, inputs, views):
        shapes.append(inputs.shape)
        return real(self, inputs, views)

    monkeypatch.setattr(CompiledDecoder, "__call__", spy)
    shape_buckets.set_enabled(True)
    try:
        compiled = make_mlx(tiny_models["qwen3"], prefill_chunk=32)
        plain = make_mlx(tiny_models["qwen3"], prefill_chunk=32, compiled_step=False)
        jobs, every = _with_twins(compiled, monkeypatch)
        shapes.clear()  # the load's check and warm-up aside
        batched = run_jobs(compiled, jobs)
        assert _texts(batched) == _texts(run_jobs(plain, jobs))
        assert run_alone(compiled, jobs[3]).text == batched[jobs[3].job_id].text
    finally:
        shape_buckets.set_enabled(None)
    chunks = {shape for shape in shapes if shape[1] > 1}
    assert (1, 32) in chunks and {rows for rows, _ in chunks} == {1}  # several rows: the module code
    assert any(tokens == 1 and rows > 1 for rows, tokens in shapes)
    assert any(rows > 1 and tokens > 1 for rows, tokens in every)  # the twins' chunks, together


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_compiled_chunks_failing_the_load_check_leave_the_compiled_decode_step(
    arch, tiny_models, make_mlx, compiling, monkeypatch
):
    # the load-time check (check.py) runs prompt chunks too: should the compiled ones fail it on some
    # GPU, they go back to the module code first, and one-token passes stay compiled
    from kinfer.engines.mlx import check, shape_buckets

    def compiled_chunks(engine) -> bool:
        if engine._decoder is not None:
            return engine._decoder.chunks
        return any(layer._kinfer_side.chunks for layer in engine._model.layers)

    real = check.check_engine_layers

    def failing_with_compiled_chunks(engine):
        if compiled_chunks(engine):
            raise EngineFailure("logits differ")
        real(engine)

    monkeypatch.setattr(check, "check_engine_layers", failing_with_compiled_chunks)
    shape_buckets.set_enabled(True)
    try:
        engine = make_mlx(tiny_models[arch], warm_up=False)
    finally:
        shape_buckets.set_enabled(None)
    assert not compiled_chunks(engine)
    compiled_decode = engine._decoder is not None or all(
        type(layer).__name__ == "CompiledDecoderLayer" for layer in engine._model.layers
    )
    assert compiled_decode
    assert run_alone(engine, _jobs(engine)[0]).new_tokens > 0


def _products_per_step(engine, rows: int) -> dict[str, float]:
    counter = OpCounter()
    engine.step_timer = counter
    run_jobs(engine, _jobs(engine)[:rows])
    names = counter.by_name()
    return {name: names.get(name, 0.0) for name in ("AddMM", "Matmul")}


def test_on_cuda_a_single_rows_residual_products_skip_addmm(
    tiny_qwen3, make_mlx, compiling, unpadded, monkeypatch
):
    # MLX's CUDA backend runs a one-row Matmul on its GEMV kernel but every AddMM on cuBLASLt (host
    # setup per call): one row's residual products are a Matmul and an add there, more rows keep addmm
    from kinfer.engines.mlx import compiled_step

    monkeypatch.setattr(compiled_step, "one_row_apart", lambda: True)
    one_row = _products_per_step(make_mlx(tiny_qwen3, rows=1), rows=1)
    two_rows = _products_per_step(make_mlx(tiny_qwen3, rows=2), rows=2)
    monkeypatch.setattr(compiled_step, "one_row_apart", lambda: False)
    as_on_metal = _products_per_step(make_mlx(tiny_qwen3, rows=1), rows=1)

    assert one_row["AddMM"] == 0 and one_row["Matmul"] > as_on_metal["Matmul"]
    assert two_rows["AddMM"] > 0 and as_on_metal["AddMM"] > 0


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_single_row_decodes_alike_with_its_products_apart(
    arch, tiny_models, make_mlx, compiling, monkeypatch
):
    from kinfer.engines.mlx import compiled_step

    path = tiny_models[arch]
    monkeypatch.setattr(compiled_step, "one_row_apart", lambda: True)
    apart = make_mlx(path, rows=1)
    plain = make_mlx(path, rows=1, compiled_step=False)
    one = _jobs(apart)[1]
    assert run_alone(apart, one).text == run_alone(plain, one).text
