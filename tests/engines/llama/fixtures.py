"""Helpers for the llama.cpp engine tests: build engines on the bundled SmolLM2 GGUF and drive them
the way the scheduler does (submit while a row is free, step until done), collecting each job's
reply. Import the fixtures into a test module with `from tests.engines.llama.fixtures import *`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kinfer.engines.llama.engine import LlamaEngine
from tests.engines.driver import GREEDY, JobResult, job, run_alone, run_jobs  # noqa: F401 (re-exported)

# a system prompt long enough for the prefix pool to bother with (it skips short prefixes)
SYSTEM = (
    "You are a careful assistant for a small bakery in Lyon. You answer questions about bread, "
    "pastries, opening hours and prices. Keep answers short and friendly, and never invent prices "
    "that are not listed. The bakery opens at seven in the morning and closes at seven at night."
)


def chat_prompt(engine: LlamaEngine, user: str, *, system: str | None = None, history: str = "") -> tuple:
    """SmolLM2's ChatML prompt for one user turn (after `history`, already rendered)."""
    text = f"<|im_start|>system\n{system}<|im_end|>\n" if system and not history else ""
    text += history + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(engine.tokenize(text))


def two_turns(engine: LlamaEngine, system: str = SYSTEM) -> tuple[tuple, tuple]:
    """A conversation's first turn, run on `engine` (greedy, 32 tokens), and its second turn's prompt,
    which holds the first turn's prompt and reply."""
    turn1 = chat_prompt(engine, "When do you open?", system=system)
    reply = run_alone(engine, job("t1", turn1, max_tokens=32))
    history = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhen do you open?<|im_end|>\n"
        f"<|im_start|>assistant\n{reply.text}<|im_end|>\n"
    )
    return turn1, chat_prompt(engine, "And when do you close?", history=history)


@pytest.fixture
def make_engine(smollm2_gguf: Path) -> Iterator[Callable[..., LlamaEngine]]:
    """Builds LlamaEngines on the bundled SmolLM2 (small rows by default) and closes them after."""
    engines: list[LlamaEngine] = []

    def make(path: Path | None = None, **kw) -> LlamaEngine:
        """`path`: another GGUF than the bundled SmolLM2 (e.g. its float32 conversion)."""
        kw.setdefault("rows", 4)
        kw.setdefault("ctx", 1024)
        # one thread: this 2-core machine is shared with other test runs, and ggml's spinning thread
        # barrier slows down several-fold when one of its threads loses its core
        kw.setdefault("threads", 1)
        engine = LlamaEngine(path or smollm2_gguf, name="smollm2", **kw)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


# ---- a tiny random-weight Mamba (recurrent state), for what SmolLM2 cannot show -----------------

MAMBA_EMBED, MAMBA_STATE, MAMBA_CONV, MAMBA_DT_RANK, MAMBA_LAYERS = 64, 16, 4, 4, 2
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: one printable character per byte."""
    ranges = [(ord("!"), ord("~")), (ord("¡"), ord("¬")), (ord("®"), ord("ÿ"))]
    printable = {b for lo, hi in ranges for b in range(lo, hi + 1)}
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_mamba(path: Path) -> Path:
    """A 2-layer Mamba GGUF with random weights and a byte-level vocabulary (ChatML specials)."""
    import numpy as np
    from gguf import GGUFWriter

    inner = 2 * MAMBA_EMBED  # llama.cpp supports an expansion factor of 2 only
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*special, *_byte_level_alphabet(), "Ġt"]
    writer = GGUFWriter(path, "mamba")
    writer.add_name("tiny-mamba")
    writer.add_context_length(4096)
    writer.add_embedding_length(MAMBA_EMBED)
    writer.add_block_count(MAMBA_LAYERS)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(MAMBA_CONV)
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(MAMBA_STATE)
    writer.add_ssm_time_step_rank(MAMBA_DT_RANK)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(special) + [1] * (len(tokens) - len(special)))
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(7)

    def normal(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # numpy shapes are ggml's dimensions reversed
    writer.add_tensor("token_embd.weight", normal(len(tokens), MAMBA_EMBED, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(MAMBA_EMBED, np.float32))
    # an untied output matrix, and a state that weighs on the residual: replies depend on the context;
    # only printable ASCII and newlines can win, so replies read as (random) text
    output = normal(len(tokens), MAMBA_EMBED, scale=1.0)
    for token, text in enumerate(tokens):
        readable = text in ("Ċ", "Ġ") or (len(text) == 1 and "!" <= text <= "~")  # newline, space, ASCII
        if token < len(special) or not readable:
            output[token] = 0.0
    writer.add_tensor("output.weight", output)
    for i in range(MAMBA_LAYERS):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(MAMBA_EMBED, np.float32))
        writer.add_tensor(f"{blk}.ssm_in.weight", normal(2 * inner, MAMBA_EMBED, scale=0.3))
        writer.add_tensor(f"{blk}.ssm_conv1d.weight", normal(inner, MAMBA_CONV, scale=0.5))
        writer.add_tensor(f"{blk}.ssm_conv1d.bias", normal(inner))
        writer.add_tensor(f"{blk}.ssm_x.weight", normal(MAMBA_DT_RANK + 2 * MAMBA_STATE, inner))
        writer.add_tensor(f"{blk}.ssm_dt.weight", normal(inner, MAMBA_DT_RANK))
        # a small step size (softplus(-3) ~ 0.05): the state remembers a few dozen tokens
        writer.add_tensor(f"{blk}.ssm_dt.bias", normal(inner) - 3.0)
        # A = -exp(A_log) < 0, as the converter stores it: the state decays
        writer.add_tensor(f"{blk}.ssm_a", -np.exp(normal(inner, MAMBA_STATE, scale=0.5)))
        writer.add_tensor(f"{blk}.ssm_d", np.ones(inner, np.float32))
        writer.add_tensor(f"{blk}.ssm_out.weight", normal(MAMBA_EMBED, inner, scale=0.5))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def tiny_mamba_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")
