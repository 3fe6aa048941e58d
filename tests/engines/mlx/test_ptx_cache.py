"""MLX on CUDA keeps the kernels it compiles under KINFER_HOME (ptx_cache.py): a reboot that empties
/tmp no longer costs the next load a minute of NVRTC (84-87 s against 15-20 s on the H200)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import pytest

from kinfer.config import Settings
from kinfer.engines.loader import load_engine
from kinfer.engines.mlx.ptx_cache import VARIABLE, keep_compiled_kernels, keep_kernels_on_cuda


def test_the_kernel_cache_lives_under_kinfers_home_one_folder_per_mlx_version(tmp_path: Path):
    environ: dict[str, str] = {}
    folder = keep_compiled_kernels(tmp_path / "home", "0.32.4", environ)
    assert folder == environ[VARIABLE] == str(tmp_path / "home" / "cache" / "mlx-ptx" / "0.32.4")
    assert Path(folder).is_dir()
    # an MLX upgrade gets a folder of its own: no kernel its predecessor compiled is loaded
    assert keep_compiled_kernels(tmp_path / "home", "0.33.0", {}).endswith("0.33.0")


def test_a_users_own_kernel_cache_wins(tmp_path: Path):
    environ = {VARIABLE: "/fast/disk/ptx"}
    assert keep_compiled_kernels(tmp_path, "0.32.4", environ) == "/fast/disk/ptx"
    assert environ == {VARIABLE: "/fast/disk/ptx"} and not (tmp_path / "cache").exists()


def test_a_home_that_cannot_hold_it_leaves_mlxs_default(tmp_path: Path):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the folder should go")
    environ: dict[str, str] = {}
    assert keep_compiled_kernels(blocker, "0.32.4", environ) == ""
    assert VARIABLE not in environ


@dataclass(frozen=True)
class Model:
    name: str
    format: str
    path: Path


def test_loading_an_mlx_model_points_mlx_at_it_first(tmp_path: Path, monkeypatch):
    from tests.fixtures.tiny_mlx import build_tiny_model

    seen = []
    monkeypatch.setattr("kinfer.engines.mlx.ptx_cache.keep_kernels_on_cuda", seen.append)
    path = build_tiny_model(tmp_path / "qwen3", "qwen3")
    engine = load_engine(Model("tiny", "mlx", path), Settings(parallel=1, ctx=128, home=tmp_path / "home"))
    engine.close()
    assert seen == [tmp_path / "home"]


@pytest.mark.parametrize("cuda", [True, False])
def test_only_mlx_on_cuda_compiles_kernels_to_keep(cuda, tmp_path: Path, monkeypatch):
    seen = []
    monkeypatch.setattr("kinfer.engines.mlx.kernels.on_cuda_gpu", lambda: cuda)
    monkeypatch.setattr(
        "kinfer.engines.mlx.ptx_cache.keep_compiled_kernels",
        lambda home, version: seen.append((home, version)) or "kept",
    )
    assert keep_kernels_on_cuda(tmp_path) == ("kept" if cuda else "")
    assert seen == ([(tmp_path, mx.__version__)] if cuda else [])
