"""The MLX engine's batched step loop on tiny random-weight llama / qwen3 / qwen3_5 models.

mlx-lm's own single-sequence greedy decoding is the reference: whatever happens around a row (other
rows of other lengths, rows finishing, rows joining, prompts prefilled in chunks), its tokens must be
exactly the ones mlx-lm gives for that prompt alone.
"""

from __future__ import annotations

import pytest

from kinfer.errors import Busy, EngineFailure, PromptTooLong
from kinfer.protocol import Sampling
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import GREEDY, chat, job, mlx_lm_greedy, readable, run_alone, run_jobs

QUESTIONS = (
    "Hi",
    "What is the capital of France?",
    "Tell me about the quick brown fox and the lazy dog, and the baker in Lyon who bakes bread at seven. "
    "Then count: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "def add(a, b): return a + b  # explain this code, please, step by step, with examples " * 3,
)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_5"])
def test_each_row_of_a_batch_matches_mlx_lm_alone(arch, tiny_models, make_mlx):
    path = tiny_models[arch]
    # a small prefill chunk: the longer prompts take several steps while the short ones already decode
    engine = make_mlx(path, prefill_chunk=32)
    prompts = [engine.tokenize(chat(q)) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == 4 and max(len(p) for p in prompts) > 64  # several KV blocks

    results = run_jobs(engine, [job(f"r{i}", p, max_tokens=20) for i, p in enumerate(prompts)])

    for i, prompt in enumerate(prompts):
        tokens, text = mlx_lm_greedy(path, prompt, 20)
        assert readable(results[f"r{i}"].text) == text
        assert results[f"r{i}"].new_tokens == len(tokens) + (len(tokens) < 20)  # EOS counts as a token
        assert results[f"r{i}"].finish == ("length" if len(tokens) == 20 else "stop")


def test_unequal_prompts_of_a_recurrent_model_share_one_padded_pass(tiny_qwen35, make_mlx):
    """Qwen3.5's recurrent layers take a right-padded pass: each row's state stops at its own end."""
    engine = make_mlx(tiny_qwen35, prefill_chunk=512)
    questions = ("What is the capital of France?", "And of Italy?", "What is the capital of Spain, please?")
    prompts = [engine.tokenize(chat(q)) for q in questions]
    passes = []
    prefill = engine._prefill

    def recording(pass_):
        passes.append((pass_.length, tuple(pass_.chunks)))
        return prefill(pass_)

    engine._prefill = recording
    results = run_jobs(engine, [job(f"r{i}", p, max_tokens=12) for i, p in enumerate(prompts)])

    padded = [(length, chunks) for length, chunks in passes if min(chunks) < length]
    assert padded and len(set(padded[0][1])) >= 2  # prompts of unequal lengths in one padded pass
    for i, prompt in enumerate(prompts):
        assert readable(results[f"r{i}"].text) == mlx_lm_greedy(tiny_qwen35, prompt, 12)[1]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_row_reused_in_place_starts_fresh(arch, tiny_models, make_mlx):
    """Two rows: a short reply finishes, the next job takes its row while the long reply goes on."""
    path = tiny_models[arch]
    engine = make_mlx(path, rows=2)
    short, long_, late = (engine.tokenize(chat(q)) for q in QUESTIONS[:3])
    seen_busy = []

    results = run_jobs(
        engine,
        [
            job("short", short, max_tokens=3),
            job("long", long_, max_tokens=24),
            job("late", late, max_tokens=12),
        ],
        on_step=lambda _, __: seen_busy.append(engine.stats().rows_busy),
    )

    assert max(seen_busy) == 2  # "late" waited for a row, then took the one "short" left
    assert results["short"].finish == "length"
    assert readable(results["long"].text) == mlx_lm_greedy(path, long_, 24)[1]
    fresh = make_mlx(path, rows=1)
    assert results["late"].text == run_alone(fresh, job("late", late, max_tokens=12)).text
    assert readable(results["late"].text) == mlx_lm_greedy(path, late, 12)[1]


def test_running_replies_keep_decoding_while_a_long_prompt_is_prefilled(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3, rows=2, prefill_chunk=16)
    runner = engine.tokenize(chat(QUESTIONS[0]))
    long_prompt = engine.tokenize(chat(QUESTIONS[3]))
    engine.submit(job("runner", runner, max_tokens=60))
    while not any(u.new_tokens for u in engine.step()):
        pass
    engine.submit(job("long", long_prompt, max_tokens=4))
    prefill_steps = 0
    while True:
        updates = {u.job_id: u for u in engine.step()}
        if "long" in updates and updates["long"].new_tokens:
            break
        prefill_steps += 1
        assert updates["runner"].new_tokens == 1  # one token per step, prefill or not
    assert prefill_steps >= len(long_prompt) // 16
    for j in ("runner", "long"):
        engine.cancel(j)
    engine.step()


def test_cancel_frees_the_row_and_leaves_the_others_alone(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3, rows=2)
    a, b, c = (engine.tokenize(chat(q)) for q in QUESTIONS[:3])
    engine.submit(job("a", a, max_tokens=50))
    engine.submit(job("b", b, max_tokens=10))
    assert engine.free_rows == 0
    with pytest.raises(Busy):
        engine.submit(job("c", c))
    text_b = ""
    for _ in range(3):
        text_b += "".join(u.text for u in engine.step() if u.job_id == "b")

    engine.cancel("a")
    assert engine.free_rows == 1
    updates = engine.step()
    assert [u.finish for u in updates if u.job_id == "a"] == ["cancelled"]
    text_b += "".join(u.text for u in updates if u.job_id == "b")

    rest = run_jobs(engine, [job("c", c, max_tokens=8)])
    assert readable(rest["c"].text) == mlx_lm_greedy(tiny_qwen3, c, 8)[1]
    assert engine.stats().rows_busy == 0
    assert readable(text_b + rest.get("b", type(rest["c"])()).text) == mlx_lm_greedy(tiny_qwen3, b, 10)[1]


def test_cancel_during_prefill(tiny_qwen35, make_mlx):
    engine = make_mlx(tiny_qwen35, rows=1, prefill_chunk=8)
    prompt = engine.tokenize(chat(QUESTIONS[3]))
    engine.submit(job("slow", prompt))
    engine.step()
    engine.cancel("slow")
    assert engine.free_rows == 1
    assert [u.finish for u in engine.step()] == ["cancelled"]
    other = engine.tokenize(chat(QUESTIONS[1]))
    assert (
        readable(run_alone(engine, job("next", other, max_tokens=8)).text)
        == mlx_lm_greedy(tiny_qwen35, other, 8)[1]
    )


def test_stop_string_ends_the_reply_before_it(tiny_llama, make_mlx):
    engine = make_mlx(tiny_llama)
    prompt = engine.tokenize(chat(QUESTIONS[1]))
    full = run_alone(engine, job("free", prompt, max_tokens=20)).text
    # the first 3-character piece of the reply that does not occur earlier in it
    at = next(
        i
        for i in range(3, len(full) - 3)
        if "\ufffd" not in full[i : i + 3] and full.find(full[i : i + 3]) == i
    )
    stop = full[at : at + 3]

    stopped = run_alone(engine, job("stopped", prompt, max_tokens=20, stop=("never-there", stop)))

    assert (stopped.finish, stopped.stop_string) == ("stop", stop)
    assert stopped.text == full[:at]


def test_eos_stops_unless_ignored(tmp_path, tiny_qwen3, make_mlx):
    import json
    import shutil

    tokens, _ = mlx_lm_greedy(tiny_qwen3, make_mlx(tiny_qwen3).tokenize(chat(QUESTIONS[1])), 10)
    model = tmp_path / "eos-model"
    shutil.copytree(tiny_qwen3, model)
    # declare the reply's 4th token an end-of-generation token (generation_config adds to config's)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [tokens[3]]}))
    engine = make_mlx(model)
    prompt = engine.tokenize(chat(QUESTIONS[1]))

    stopped = run_alone(engine, job("eos", prompt, max_tokens=10))
    ignored = run_alone(engine, job("ignore", prompt, max_tokens=10, ignore_eos=True))

    assert stopped.finish == "stop" and stopped.new_tokens == 4
    assert readable(stopped.text) == readable(engine.detokenize(tokens[:3]))
    assert ignored.finish == "length" and ignored.new_tokens == 10


def test_max_tokens_and_a_full_row_end_with_length(tiny_llama, make_mlx):
    engine = make_mlx(tiny_llama, ctx=64)
    prompt = engine.tokenize(chat(QUESTIONS[1]))

    capped = run_alone(engine, job("capped", prompt, max_tokens=5))
    full = run_alone(engine, job("full", prompt, max_tokens=500, ignore_eos=True))

    assert (capped.finish, capped.new_tokens) == ("length", 5)
    # the row holds 64 tokens: the prompt, and replies up to the last one sampled (never fed back)
    assert (full.finish, full.new_tokens) == ("length", 64 - len(prompt) + 1)
    with pytest.raises(PromptTooLong):
        engine.submit(job("too-long", list(range(65))))


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3)
    prompt = engine.tokenize(chat(QUESTIONS[1]))
    other = engine.tokenize(chat(QUESTIONS[2]))

    def sampled(seed, **kw):
        return Sampling(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed, **kw})

    alone = run_alone(engine, job("a", prompt, max_tokens=16, sampling=sampled(7))).text
    together = run_jobs(
        engine,
        [
            job("x", other, max_tokens=16, sampling=sampled(1)),
            job("a", prompt, max_tokens=16, sampling=sampled(7)),
        ],
    )["a"].text
    others = {
        run_alone(engine, job("b", prompt, max_tokens=16, sampling=sampled(s))).text for s in range(8, 12)
    }
    greedy = run_alone(engine, job("g", prompt, max_tokens=16)).text
    top1 = run_alone(engine, job("k", prompt, max_tokens=16, sampling=sampled(3, top_k=1))).text

    assert together == alone
    assert others - {alone}  # another seed gives another reply
    assert top1 == greedy  # top-k 1 leaves only the argmax to draw


def test_repeat_penalty_changes_a_repetitive_reply(tiny_llama, make_mlx):
    engine = make_mlx(tiny_llama)
    prompt = engine.tokenize(chat(QUESTIONS[0]))
    plain = run_alone(engine, job("plain", prompt, max_tokens=24)).text
    penalized = run_alone(
        engine, job("pen", prompt, max_tokens=24, sampling=Sampling(temperature=0.0, repeat_penalty=1.5))
    ).text
    assert penalized != plain


def test_stats_report_mlx_memory(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3)
    run_alone(engine, job("a", engine.tokenize(chat(QUESTIONS[1])), max_tokens=4))
    stats = engine.stats()
    assert stats.memory["total"] > 0 and stats.memory["peak"] >= stats.memory["total"]
    assert "cache" in stats.memory and stats.memory["kv"] > 0
    assert stats.generated_tokens_total == 4 and stats.rows_total == 4 and stats.steps_total > 0


def test_model_info(tiny_qwen35, make_mlx):
    engine = make_mlx(tiny_qwen35, rows=3, ctx=256)
    info = engine.info
    assert (info.engine, info.architecture, info.rows, info.context_length) == ("mlx", "qwen3_5", 3, 256)
    assert info.recurrent and info.eos_token == "<|im_end|>" and "<|im_start|>" in info.chat_template
    assert info.train_context_length == 4096


def test_half_precision_weights_load_and_generate(tmp_path, make_mlx):
    from tests.fixtures.tiny_mlx import build_tiny_model

    path = build_tiny_model(tmp_path / "bf16", "qwen3", dtype="bfloat16")
    engine = make_mlx(path)
    result = run_alone(engine, job("a", engine.tokenize(chat("Hi")), max_tokens=6, ignore_eos=True))
    assert (result.finish, result.new_tokens) == ("length", 6)


def test_quantized_model_matches_mlx_lm(tmp_path, tiny_llama, make_mlx):
    """An MLX 4-bit checkpoint (what mlx_lm.convert -q writes) loads and decodes like mlx-lm."""
    import shutil

    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    quant = tmp_path / "q4"
    shutil.copytree(tiny_llama, quant)
    model, config = load_model(quant)
    model, config = quantize_model(model, config, group_size=32, bits=4)
    (quant / "model.safetensors").unlink()
    save_model(quant, model)
    save_config(config, quant / "config.json")

    engine = make_mlx(quant)
    prompt = engine.tokenize(chat(QUESTIONS[1]))
    assert (
        readable(run_alone(engine, job("q", prompt, max_tokens=12)).text)
        == mlx_lm_greedy(quant, prompt, 12)[1]
    )


def test_sliding_window_layers_match_mlx_lm(tmp_path, make_mlx):
    """Sliding-window attention (mlx-lm's RotatingKVCache layers): each row attends to its last 24
    positions only, through prompts and replies longer than the window."""
    from tests.fixtures.tiny_mlx import build_tiny_model

    path = build_tiny_model(
        tmp_path / "swa",
        "llama",
        config={"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 24},
    )
    engine = make_mlx(path, prefill_chunk=20)
    prompts = [engine.tokenize(chat(q)) for q in QUESTIONS[1:]]
    results = run_jobs(engine, [job(f"w{i}", p, max_tokens=30) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert readable(results[f"w{i}"].text) == mlx_lm_greedy(path, prompt, 30)[1]


def test_a_directory_mlx_lm_cannot_load_fails_at_load(tmp_path, tiny_llama, make_mlx):
    import json
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "no_such_architecture"}))
    with pytest.raises(EngineFailure, match="no_such_architecture"):
        make_mlx(broken)


def test_greedy_constant_is_greedy():
    assert GREEDY.greedy
