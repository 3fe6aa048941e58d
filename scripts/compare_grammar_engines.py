"""Compare grammar engines for constrained decoding: llguidance (what kinfer uses) and xgrammar.

    .venv/bin/python scripts/compare_grammar_engines.py llguidance
    pip install --no-deps --target /tmp/xg xgrammar==0.2.8 "apache-tvm-ffi>=0.1.11"
    PYTHONPATH=/tmp/xg .venv/bin/python scripts/compare_grammar_engines.py xgrammar

On the bundled SmolLM2's vocabulary (its float32 directory's tokenizer.json, built and cached by
kinfer.testing.smollm_f32): the time to build the engine's tokenizer, to compile a nested JSON schema,
and to compute each token's mask while a valid reply is fed through. xgrammar imports torch at the
top but needs it only for its own tensors; the masks here are numpy arrays, so a stub module stands
in for torch (xgrammar depends on torch, transformers and triton: gigabytes kinfer does not install).
"""

from __future__ import annotations

import json
import sys
import time
import types

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "geo": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "address"],
    "additionalProperties": False,
}
REPLY = {
    "name": "Alice",
    "age": 31,
    "score": 0.75,
    "role": "admin",
    "tags": ["a", "bb"],
    "address": {"city": "Paris", "zip": "75001", "geo": [2.35, 48.85]},
}


def tokenizer_json() -> str:
    from kinfer.store.bundled import bundled_gguf
    from kinfer.testing.smollm_f32 import build_smollm_f32

    return str(build_smollm_f32(bundled_gguf()).hf_dir / "tokenizer.json")


def measure_llguidance(path: str, reply: list[int]) -> dict:
    import llguidance
    import llguidance.numpy as lln

    started = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(path)
    tokenizer_s = time.perf_counter() - started
    layout = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    started = time.perf_counter()
    matcher = llguidance.LLMatcher(
        tokenizer, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=layout)
    )
    compile_s = time.perf_counter() - started
    assert not matcher.is_error(), matcher.get_error()
    mask = lln.allocate_token_bitmask(1, tokenizer.vocab_size)

    def step(token: int) -> None:
        lln.fill_next_token_bitmask(matcher, mask, 0)
        assert (mask[0, token // 32] >> (token % 32)) & 1
        assert matcher.consume_token(token)

    return _report("llguidance", tokenizer_s, compile_s, reply, step)


def measure_xgrammar(path: str, reply: list[int]) -> dict:
    import tvm_ffi  # noqa: F401  (imported before the stub, so it finds no torch)
    from transformers import PreTrainedTokenizerFast

    class _NoTorch(types.ModuleType):
        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

    stub = _NoTorch("torch")
    stub.tensor = lambda *a, **k: None  # type: ignore[attr-defined]
    sys.modules["torch"] = stub
    import xgrammar

    started = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_file=path)
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    tokenizer_s = time.perf_counter() - started
    started = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
    compile_s = time.perf_counter() - started
    mask = np.full((1, (len(hf) + 31) // 32), -1, dtype=np.int32)

    def step(token: int) -> None:
        matcher.fill_next_token_bitmask(mask, 0)
        assert (mask[0, token // 32] >> (token % 32)) & 1
        assert matcher.accept_token(token)

    return _report("xgrammar", tokenizer_s, compile_s, reply, step)


def _report(engine: str, tokenizer_s: float, compile_s: float, reply: list[int], step) -> dict:
    times = []
    for token in reply:
        started = time.perf_counter()
        step(token)
        times.append(time.perf_counter() - started)
    us = np.array(times) * 1e6
    return {
        "engine": engine,
        "tokenizer_s": round(tokenizer_s, 3),
        "compile_ms": round(compile_s * 1e3, 2),
        "tokens": len(reply),
        "mask_us_p50": round(float(np.median(us)), 1),
        "mask_us_mean": round(float(us.mean()), 1),
        "mask_us_max": round(float(us.max()), 1),
    }


def main() -> int:
    engine = sys.argv[1] if len(sys.argv) > 1 else "llguidance"
    from tokenizers import Tokenizer

    path = tokenizer_json()
    reply = Tokenizer.from_file(path).encode(json.dumps(REPLY), add_special_tokens=False).ids
    measure = {"llguidance": measure_llguidance, "xgrammar": measure_xgrammar}[engine]
    print(json.dumps(measure(path, reply)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
