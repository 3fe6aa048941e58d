"""How many CUDA graphs MLX keeps ready, and what it does when they outnumber its room.

MLX's CUDA backend records an eval's kernels as CUDA graphs and keeps the executable ones in an LRU
cache keyed by topology, 400 by default (`MLX_CUDA_GRAPH_CACHE_SIZE`): a graph met again is updated in
place, one not there is instantiated (~2 ms of host time each, several a pass). kinfer's warm-up
(warm_up.py) runs every pass shape serving meets first, and for a long context that is more graphs than
400: on an H100 (qwen3.5-0.8b, 17 rows of 65,536 tokens) the chunk passes of each key bucket were
evicted again before a long prompt reached them, and every crossing into a new bucket stalled the 16
streaming replies for 35-58 ms against a 9 ms step; with room for 4,000 no chunk step took over 16 ms
(docs/benchmarks.md, "H100, 2026-12-05").

MLX 0.32 also counts every miss of such a cache and throws ("Cache thrashing is happening") once they
pass twice its capacity: a long-running server meeting 800 new graph topologies in its life would fail
a step. kinfer raises the cache to GRAPH_CACHE and turns that throw off (a slow step beats a failed
one; the step log shows slow steps); a user's own values win. MLX reads both when it makes the device's
command encoder, at its first GPU work, so this runs before any: before a model loads, before a rank
joins its group. Elsewhere (CPU, Metal) MLX never reads them.
"""

from __future__ import annotations

import os

GRAPH_CACHE = 4000
SETTINGS = {
    "MLX_CUDA_GRAPH_CACHE_SIZE": str(GRAPH_CACHE),
    "MLX_ENABLE_CACHE_THRASHING_CHECK": "0",
}


def keep_graphs(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """Set MLX's CUDA graph cache settings the user did not; returns the values in force."""
    for name, value in SETTINGS.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in SETTINGS}
