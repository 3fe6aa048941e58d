"""Do a GGUF's batched greedy replies equal their solo runs on kinfer's llama.cpp engine? Any quantization.

    python scripts/check_batched_exact.py MODEL.gguf
    python scripts/check_batched_exact.py --quantize 15 --out /tmp/smol-q4km.gguf   # SmolLM2 as Q4_K_M
    GGML_CPU_TILED_MM=0 python scripts/check_batched_exact.py MODEL.gguf --no-repack  # both kernels off

Runs eight short chats together (one decode pass of eight rows a step), then each alone, greedy, 48
tokens, and prints how many batched replies equal their solo run. `--quantize FTYPE` first builds the
GGUF from the bundled SmolLM2's float32 conversion with llama.cpp's quantizer (llama_ftype numbers:
15 = Q4_K_M, 7 = Q8_0, 2 = Q4_0). `--no-repack` loads the weights without llama.cpp's repacked CPU
layouts (`use_extra_bufts` off); `GGML_CPU_TILED_MM=0` turns off ggml's tiled K-quant matmul. On this
VM SmolLM2 as Q4_K_M matched 0 of 8 as loaded, 1 of 8 without repacking, 8 of 8 with both off; the
suite's Q4_1 and F32 models match 8 of 8 as loaded (docs/architecture.md, the llama.cpp engine).

`--long N` opens every chat with the same N-word preamble (300 words: ~890-token prompts, chunked
beside the rows already generating, and replies past 512 cells), and `--flash-attn` is kinfer's
setting (`auto`: off on a CPU). With `--long 300` the bundled model matched 8 of 8 with flash
attention off and 1 of 8 with it on (docs/benchmarks.md, "Flash attention on a CPU kept exact").
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kinfer.config import parse_switch
from kinfer.engines.base import GenerationJob
from kinfer.engines.llama import engine as llama_engine
from kinfer.engines.llama import native
from kinfer.protocol import Sampling
from kinfer.store.bundled import bundled_gguf

TOPICS = ("volcanoes", "bread", "the moon", "chess", "rivers", "cats", "trains", "music")
CHAT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nTell me about {}.<|im_end|>\n<|im_start|>assistant\n"
)


def quantize(ftype: int, out: Path) -> Path:
    import llama_cpp

    from kinfer.testing.smollm_f32 import build_smollm_f32

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    source = build_smollm_f32(bundled_gguf()).gguf
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to ftype {ftype}")
    return out


def replies(engine: llama_engine.LlamaEngine, jobs: list[GenerationJob]) -> dict[str, list[str]]:
    """Every job's reply text, the jobs submitted together and stepped to the end."""
    for job in jobs:
        engine.submit(job)
    texts: dict[str, list[str]] = {job.job_id: [] for job in jobs}
    while engine.has_work:
        for update in engine.step():
            if update.text:  # a long prompt's chunks report progress with no text
                texts[update.job_id].append(update.text)
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("gguf", type=Path, nargs="?", help="default: the bundled SmolLM2 (or --quantize's)")
    parser.add_argument("--quantize", type=int, help="build the GGUF first: a llama_ftype number")
    parser.add_argument("--out", type=Path, default=Path("/tmp/smollm2-quantized.gguf"))
    parser.add_argument("--no-repack", action="store_true", help="no repacked CPU weight layouts")
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto", help="as kinfer's")
    parser.add_argument("--long", type=int, default=0, help="a shared preamble of this many words first")
    args = parser.parse_args()
    gguf = quantize(args.quantize, args.out) if args.quantize is not None else args.gguf or bundled_gguf()
    if args.no_repack:
        defaults = native.lib.llama_model_default_params

        def without_repack():
            params = defaults()
            params.use_extra_bufts = False
            return params

        native.lib.llama_model_default_params = without_repack
    engine = llama_engine.LlamaEngine(
        gguf,
        name="exact",
        rows=len(TOPICS),
        ctx=1024 * (1 + args.long // 200),
        threads=2,
        prefix_cache=False,
        flash_attn=parse_switch(args.flash_attn, auto=True),
    )
    try:
        greedy = Sampling(temperature=0.0)
        preamble = " ".join(f"word{i % 97}" for i in range(args.long))
        prompts = {t: tuple(engine.tokenize(preamble + CHAT.format(t))) for t in TOPICS}
        batched = replies(engine, [GenerationJob(t, p, greedy, max_tokens=48) for t, p in prompts.items()])
        same = 0
        for topic, prompt in prompts.items():
            solo = replies(engine, [GenerationJob(topic, prompt, greedy, max_tokens=48)])[topic]
            same += solo == batched[topic]
            if solo != batched[topic]:
                print(f"{topic}: solo {''.join(solo)[:60]!r}\n  batched {''.join(batched[topic])[:60]!r}")
        flash = "on" if engine.flash_attention else "off"
        equal = f"{same} of {len(TOPICS)} batched replies equal their solo runs"
        print(f"{gguf.name}, flash attention {flash}: {equal}")
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
