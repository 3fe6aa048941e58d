"""llama.cpp's sampler chain for one row, built from `Sampling` (llama-cpp-python's ctypes API)."""

from __future__ import annotations

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp as lib  # isort: skip

from kinfer.protocol import Sampling


def make_sampler(sampling: Sampling, n_vocab: int, context_length: int) -> int:
    """A sampler chain in llama.cpp's order: penalties -> top-k -> top-p -> min-p -> temperature ->
    draw (seeded), or penalties -> greedy when temperature <= 0. The caller frees it with
    `free_sampler`. `repeat_last_n` < 0 means the whole row, as in llama.cpp."""
    params = lib.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = lib.llama_sampler_chain_init(params)
    add = lib.llama_sampler_chain_add
    if has_penalties(sampling):
        add(
            chain,
            lib.llama_sampler_init_penalties(
                n_vocab,
                penalty_window(sampling, context_length),
                sampling.repeat_penalty,
                sampling.frequency_penalty,
                sampling.presence_penalty,
            ),
        )
    if sampling.greedy:
        add(chain, lib.llama_sampler_init_greedy())
        return chain
    # samplers whose parameters make them no-ops are left out: each one costs a pass over the vocab
    if 0 < sampling.top_k < n_vocab:
        add(chain, lib.llama_sampler_init_top_k(sampling.top_k))
    if 0.0 < sampling.top_p < 1.0:
        add(chain, lib.llama_sampler_init_top_p(sampling.top_p, 1))
    if sampling.min_p > 0.0:
        add(chain, lib.llama_sampler_init_min_p(sampling.min_p, 1))
    add(chain, lib.llama_sampler_init_temp(sampling.temperature))
    seed = lib.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed & 0xFFFFFFFF
    add(chain, lib.llama_sampler_init_dist(seed))
    return chain


def penalty_window(sampling: Sampling, context_length: int) -> int:
    """How many recent tokens the penalties look at."""
    return context_length if sampling.repeat_last_n < 0 else sampling.repeat_last_n


def has_penalties(sampling: Sampling) -> bool:
    active = (
        sampling.repeat_penalty != 1.0,
        sampling.frequency_penalty != 0.0,
        sampling.presence_penalty != 0.0,
    )
    return sampling.repeat_last_n != 0 and any(active)


def sampler_accept(chain: int, token: int) -> None:
    lib.llama_sampler_accept(chain, token)


def sampler_sample(chain: int, ctx: int, index: int) -> int:
    """Sample from the logits at batch index `index` and accept the token into the chain."""
    return int(lib.llama_sampler_sample(chain, ctx, index))


def free_sampler(chain: int) -> None:
    lib.llama_sampler_free(chain)
