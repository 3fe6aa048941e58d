"""OpenMP's wait policy for llama.cpp's CPU threads, chosen before libllama (and libgomp) loads.

llama-cpp-python's CPU build runs ggml's threads under OpenMP, whose default waits at every barrier
by spinning. A decode step of a small model has hundreds of barriers; when another process takes one
of the cores, a spinning thread burns its slice waiting for a thread that is not running, and decode
collapses (measured on a 2-core VM with one busy process per core: 1.0 tok/s at one row instead of
~70 quiet). `PASSIVE` makes a waiting thread sleep instead: docs/benchmarks.md "A shared CPU" has the
quiet and busy figures of each policy, measured side by side (scripts/bench_shared_cpu.py).

libgomp reads its environment once, when it loads, so this module must be imported before llama_cpp
(every module of kinfer that imports llama_cpp imports this first). A user's own `OMP_WAIT_POLICY` or
`GOMP_SPINCOUNT` wins: that is the override.
"""

from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def choose_wait_policy(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Set kinfer's OpenMP wait policy unless the user chose one; returns the policy in force (None:
    the user set a spin count only)."""
    if not any(key in environ for key in USER_KEYS):
        environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return environ.get("OMP_WAIT_POLICY")


choose_wait_policy()
