"""Does MLX update an array in place while a pass that read it is still running? (issue 18's stalls)

    python scripts/probe_donation.py [--mib 256]

MLX writes `pool[rows] = values` (a scatter: kinfer's KV pools take every pass's new keys and values
that way, kv.py) into the pool's own buffer only when nothing else holds the pool: otherwise it copies
the whole pool first. The inputs of work still running on the device are such holders (MLX keeps them
until that work completes), so whether a scatter copies depends on how far the device has got when the
host builds it. This probe times it out: a slow reader of a pool is launched, then the scatter, either
at once or after the reader finished, and the allocator's growth at the scatter is printed (the pool's
size: a copy; 0: in place). On CUDA the copy is one more kernel in the pass's CUDA graph, so a pass
can have several topologies, picked by timing. Suspected on 2026-12-05 of the stall's slow step; an
H100 run with the KV pools written in place ruled the pools' writes out (docs/benchmarks.md, "H100,
2026-12-06"), and the step turned out to be the pools growing inside the pass (row_blocks._grow,
"H100, second session of 2026-12-06"). The probe's point holds for any array a pass updates.
"""

from __future__ import annotations

import argparse

import mlx.core as mx


def growth_at_scatter(pool: mx.array, weight: mx.array, *, reader_done: bool) -> tuple[mx.array, int]:
    reader = (pool @ weight).sum()  # reads the whole pool: a pass's attention
    mx.async_eval(reader)
    if reader_done:
        mx.eval(reader)
    before = mx.get_active_memory()
    pool[mx.array([5, 9, 700], dtype=mx.int32)] = mx.ones((3, pool.shape[1]), dtype=pool.dtype)
    mx.async_eval(pool)
    grown = mx.get_active_memory() - before
    mx.eval(pool, reader)
    return pool, grown


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=256, help="the pool's size")
    args = parser.parse_args()
    pool = mx.zeros((args.mib << 10, 256), dtype=mx.float32)  # 1 KiB a row
    weight = mx.random.normal((256, 256))
    mx.eval(pool, weight)
    for reader_done in (False, True, False, True):
        grown = []
        for _ in range(3):
            pool, by = growth_at_scatter(pool, weight, reader_done=reader_done)
            grown.append(by >> 20)
        when = "after the reader finished" if reader_done else "with the reader in flight"
        print(f"scatter {when}: the allocator grew by {grown} MiB")


if __name__ == "__main__":
    main()
