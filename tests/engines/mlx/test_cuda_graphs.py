"""MLX on CUDA keeps room for every graph kinfer's warm-up builds, and never fails a step because its
graph cache missed too often (cuda_graphs.py): on an H100 a long prompt's chunks stalled 16 streaming
replies for 35-58 ms at each new key bucket with MLX's 400, under 16 ms with 4,000."""

from __future__ import annotations

from pathlib import Path

from kinfer.config import Settings
from kinfer.engines.loader import load_engine
from kinfer.engines.mlx.cuda_graphs import GRAPH_CACHE, keep_graphs
from kinfer.engines.mlx.engine import MlxEngine
from tests.engines.mlx.test_ptx_cache import Model
from tests.fixtures.tiny_mlx import build_tiny_model


def test_mlx_keeps_room_for_thousands_of_graphs_and_never_throws_on_misses():
    environ: dict[str, str] = {}
    assert keep_graphs(environ) == {
        "MLX_CUDA_GRAPH_CACHE_SIZE": str(GRAPH_CACHE),
        "MLX_ENABLE_CACHE_THRASHING_CHECK": "0",
    }
    assert GRAPH_CACHE >= 4000 and environ == keep_graphs(environ)


def test_a_users_own_graph_settings_win():
    environ = {"MLX_CUDA_GRAPH_CACHE_SIZE": "800", "MLX_ENABLE_CACHE_THRASHING_CHECK": "1"}
    assert keep_graphs(environ) == {
        "MLX_CUDA_GRAPH_CACHE_SIZE": "800",
        "MLX_ENABLE_CACHE_THRASHING_CHECK": "1",
    }


def test_loading_an_mlx_model_sets_them_before_the_engine_touches_the_device(tmp_path: Path, monkeypatch):
    order: list[str] = []
    monkeypatch.setattr("kinfer.engines.mlx.cuda_graphs.keep_graphs", lambda: order.append("graphs"))
    real_init = MlxEngine.__init__

    def init(self, *args, **kwargs):
        order.append("engine")
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(MlxEngine, "__init__", init)
    path = build_tiny_model(tmp_path / "qwen3", "qwen3")
    engine = load_engine(Model("tiny", "mlx", path), Settings(parallel=1, ctx=128, home=tmp_path / "home"))
    engine.close()
    assert order == ["graphs", "engine"]
