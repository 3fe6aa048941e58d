"""llama.cpp's OpenMP threads spin briefly, then sleep, unless the user says otherwise; set before
libgomp loads.

With OpenMP's default (spinning) wait, llama.cpp's decode collapsed to 0.8 tok/s on a 2-core machine
with one busy process per core (docs/benchmarks.md, "A shared CPU"). libgomp reads its environment once
when it loads, so the spin count must be in the environment before any kinfer module loads llama_cpp.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kinfer.engines.llama.openmp import SPIN_COUNT, choose_wait


def _probe(first_import: str, env: dict[str, str]) -> list[str]:
    probe = (
        f"import {first_import}, os, sys; names = list(sys.modules); "
        "print(names.index('kinfer.engines.llama.openmp') < names.index('llama_cpp')); "
        "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=clean | env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()


@pytest.mark.parametrize(
    "first_import",
    [
        "kinfer.server.app",
        "kinfer.engines.llama.engine",
        "kinfer.engines.llama.embed",
        "kinfer.engines.llama.embed_context",
        "kinfer.engines.llama.embed_pool",
        "kinfer.constrain.runtime",
    ],
)
def test_the_spin_count_is_set_before_llama_cpp_loads(first_import):
    assert _probe(first_import, {}) == ["True", "None", SPIN_COUNT]


def test_a_users_own_wait_policy_wins():
    assert _probe("kinfer.engines.llama.engine", {"OMP_WAIT_POLICY": "ACTIVE"}) == ["True", "ACTIVE", "None"]


def test_a_users_spin_count_is_left_alone():
    environ = {"GOMP_SPINCOUNT": "10000"}
    assert choose_wait(environ) == "10000"
    assert environ == {"GOMP_SPINCOUNT": "10000"}


def test_kinfer_spins_briefly_then_sleeps_by_default():
    environ: dict[str, str] = {}
    assert choose_wait(environ) == SPIN_COUNT == "3000"
    assert "OMP_WAIT_POLICY" not in environ
