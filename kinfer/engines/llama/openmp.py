"""OpenMP's wait for llama.cpp's CPU threads, chosen before libllama (and libgomp) loads.

llama-cpp-python's CPU build runs ggml's threads under OpenMP, whose default waits at every barrier
by spinning (300,000 turns before it sleeps). A decode step of a small model has hundreds of
barriers; when another process takes one of the cores, a spinning thread burns its slice waiting for
a thread that is not running, and decode collapses (measured on a 2-core VM with one busy process per
core: 0.8 tok/s at one row instead of 66 quiet). kinfer sets `GOMP_SPINCOUNT=3000`: a thread spins
briefly (most barriers of a quiet machine are met within it), then sleeps. Measured side by side
(docs/benchmarks.md "A shared CPU", scripts/bench_shared_cpu.py): quiet, 56-65 tok/s at one row, as
fast as spinning; busy, 9.6-30.6 (spinning: 0.8-16). `OMP_WAIT_POLICY=PASSIVE` (sleep at once) kept a
steadier busy speed (18-33) but cost a quarter of the quiet one-row speed (45-52), and put kinfer at
0.63-0.70x llama-server's one-stream tok/s where this keeps 0.84-0.93x.

The wait is half of it: with two threads on two busy cores every barrier still waits for a thread
the OS descheduled, so decode steps also move to fewer threads while that is faster
(thread_tuner.py, decode_threads.py).

libgomp reads its environment once, when it loads, so this module must be imported before llama_cpp
(every module of kinfer that imports llama_cpp imports this first). A user's own `OMP_WAIT_POLICY` or
`GOMP_SPINCOUNT` wins: that is the override.
"""

from __future__ import annotations

import os

SPIN_COUNT = "3000"  # barrier turns a waiting thread spins before it sleeps
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def choose_wait(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Set kinfer's OpenMP spin count unless the user chose a wait; returns the spin count in force
    (None: the user set a wait policy only)."""
    if not any(key in environ for key in USER_KEYS):
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return environ.get("GOMP_SPINCOUNT")


choose_wait()
