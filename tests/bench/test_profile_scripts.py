"""scripts/profile_steps.py (the MLX engine's steps, scenario by scenario, for a native profiler) and
scripts/read_stacks.py (such a profile filed by Python function, MLX primitive and library)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.mlx.fixtures import *  # noqa: F403

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_sample_is_filed_under_its_python_function_primitive_and_library_activity(tmp_path: Path):
    stacks = tmp_path / "stacks.txt"
    compile_gather = [
        "main (profile_steps.py:10)",
        "MlxEngine.step (kinfer/engines/mlx/engine.py:300)",
        "MlxEngine._decode (kinfer/engines/mlx/engine.py:411)",
        "mlx::core::async_eval (libmlx.so)",
        "mlx::core::Gather::eval_gpu (libmlx.so)",
        "mlx::core::cu::JitModule::JitModule (libmlx.so)",
        "nvrtcCompileProgram (libnvrtc.so)",
    ]
    matmul = [*compile_gather[:2], "MlxEngine._launch (kinfer/engines/mlx/engine.py:390)",
              "mlx::core::Matmul::eval_gpu (libmlx.so)", "cublasLtMatmul (libcublasLt.so)"]  # fmt: skip
    loading = ["main (profile_steps.py:10)", "MlxEngine.__init__ (kinfer/engines/mlx/engine.py:100)"]
    stacks.write_text(f"{';'.join(compile_gather)} 3\n{';'.join(matmul)} 1\n{';'.join(loading)} 50\n")
    total, filed = _load("read_stacks").read(stacks)
    assert total == 4  # the load's samples lie outside any step
    assert filed == {
        ("MlxEngine._decode", "Gather", "NVRTC compiling a kernel"): 3,
        ("MlxEngine._launch", "Matmul", "cuBLASLt"): 1,
    }


def test_the_ptx_watch_reports_each_module_once_as_it_appears(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    (tmp_path / "copy_float32.ptx").write_text("")
    watch = _load("profile_steps").PtxWatch()
    assert watch.new() == []  # what the load compiled is not news
    (tmp_path / "gather_int32_int32_1.ptx").write_text("")
    (tmp_path / "gather_int32_int32_1.txt").write_text("")
    assert watch.new() == ["gather_int32_int32_1"]
    assert watch.new() == []


@pytest.mark.slow
def test_the_stall_scenario_logs_every_step_around_a_long_prompt(tiny_qwen35: Path, tmp_path: Path):
    out = tmp_path / "stall.json"
    env = {**os.environ, "MLX_DISABLE_COMPILE": "1"}
    command = [sys.executable, str(SCRIPTS / "profile_steps.py"), "stall", "--weights", str(tiny_qwen35),
               "--rows", "3", "--prompt-tokens", "600", "--ctx", "1024", "--before", "30", "--after", "5",
               "--json", str(out)]  # fmt: skip
    subprocess.run(command, check=True, env=env, timeout=600, capture_output=True)
    result = json.loads(out.read_text())
    steps = result["steps"]
    assert len(steps) >= 30 + 5 + 1
    assert all(
        s["ms"] > 0 and {"build", "launch", "prefill", "decoding", "compiled"} <= set(s) for s in steps
    )
    assert sum(s["prefill"] for s in steps) >= 600  # the long prompt went through in the window
    assert result["prefill_steps_ms"] and result["long_first_token_s"] > 0
