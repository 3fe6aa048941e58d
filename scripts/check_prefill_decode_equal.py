"""Do the same tokens give the same logits whether evaluated as one prompt, in pieces, or one at a time?

    .venv/bin/python scripts/check_prefill_decode_equal.py                 # flash attention on
    .venv/bin/python scripts/check_prefill_decode_equal.py --flash-attn off

300 tokens of the bundled SmolLM2 through llama-cpp-python: once as one prompt, then as 64 tokens and
one at a time (a reply's decode), then in mixed pieces (100, 5, 1, 1, 2, 63, 64, 3, then one at a
time). Prints, per piecing, how many of the 300 rows of logits differ from the one-prompt run. With
kinfer's batch-invariant CPU flash attention (scripts/setup.sh) none do; with upstream's kernel
(`GGML_CPU_FA_BATCH_INVARIANT=0`) or with flash attention off, most do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp  # isort: skip

from kinfer.store.bundled import bundled_gguf

TEXT = " ".join(f"word{i} is here and the lighthouse keeper looks at the sea." for i in range(40))
TOKENS = 300


def logits(pieces: list[int], flash_attn: bool, threads: int) -> np.ndarray:
    llm = llama_cpp.Llama(
        str(bundled_gguf()), n_ctx=1024, n_batch=512, n_ubatch=512, logits_all=True,
        flash_attn=flash_attn, n_threads=threads, verbose=False,
    )  # fmt: skip
    tokens = llm.tokenize(TEXT.encode())[:TOKENS]
    rows, at = [], 0
    for n in pieces:
        llm.eval(tokens[at : at + n])
        rows.append(np.array(llm.scores[at : at + n]))
        at += n
    assert at == len(tokens) == TOKENS
    return np.concatenate(rows)


PIECINGS: dict[str, Callable[[int], list[int]]] = {
    "64 tokens, then one at a time": lambda n: [64] + [1] * (n - 64),
    "mixed pieces": lambda n: [100, 5, 1, 1, 2, 63, 64, 3] + [1] * (n - 239),
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    flash_attn = args.flash_attn == "on"
    whole = logits([TOKENS], flash_attn, args.threads)
    differing = 0
    for name, piecing in PIECINGS.items():
        diff = np.abs(logits(piecing(TOKENS), flash_attn, args.threads) - whole).max(axis=1)
        rows = int((diff > 0).sum())
        differing += rows
        print(f"{name}: {rows} of {len(diff)} rows differ from the one-prompt run (max {diff.max():.3g})")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
