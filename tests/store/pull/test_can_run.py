"""`can_run()`: memory estimates and verdicts per variant, without downloading any weights."""

from __future__ import annotations

import json

import pytest

from kinfer.store.can_run import (
    HEADER_PREFIX_BYTES,
    OVERHEAD_BYTES,
    MachineMemory,
    can_run,
    format_report,
)
from kinfer.store.pull_plan import UnsupportedModel
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.fixtures.tiny_gguf import EMBED, HEADS, KV_HEADS
from tests.store.pull.conftest import mlx_repo_files

GiB = 1024**3
# the tiny GGUF: 2 blocks, 2 KV heads of EMBED // HEADS; K and V in f16
KV_BYTES_PER_TOKEN = 2 * KV_HEADS * (EMBED // HEADS) * 2 * 2
SMALL_MACHINE = MachineMemory(ram_total=8 * GiB, ram_available=5 * GiB)


@pytest.fixture
def sized_repo(hub: HubServer, gguf_bytes) -> str:
    """Four quants that claim real model sizes; only their headers are ever served."""
    header = gguf_bytes()
    sizes = {"Q2_K": 1 * GiB, "Q4_K_M": 2 * GiB, "Q8_0": 4 * GiB, "F16": 8 * GiB}
    files = {f"Tiny-{tag}.gguf": header for tag in sizes}
    files["mmproj-Tiny-F16.gguf"] = header
    hub.repos["o/Tiny-GGUF"] = FakeRepo(
        files, virtual_sizes={f"Tiny-{tag}.gguf": size for tag, size in sizes.items()}
    )
    return "o/Tiny-GGUF"


def test_each_quant_gets_a_verdict_against_the_machine(hub: HubServer, sized_repo: str) -> None:
    report = can_run(sized_repo, machine=SMALL_MACHINE)

    assert report.architecture == "llama" and report.llama_cpp is True and report.mlx is None
    assert [(v.tag, v.verdict) for v in report.variants] == [
        ("Q2_K", "comfortable"),
        ("Q4_K_M", "comfortable"),
        ("Q8_0", "tight"),
        ("F16", "too large"),
    ]
    q4 = report.variants[1]
    assert q4.weights_bytes == 2 * GiB
    assert q4.kv_bytes == KV_BYTES_PER_TOKEN * 4096 * 4  # default context x default rows
    assert q4.needed_bytes == 2 * GiB + q4.kv_bytes + OVERHEAD_BYTES + int(0.05 * 2 * GiB)
    assert report.best is q4
    assert report.pull_command == "kinfer pull hf.co/o/Tiny-GGUF:q4_k_m"


def test_the_estimate_follows_context_and_rows(hub: HubServer, sized_repo: str) -> None:
    small = can_run(sized_repo, machine=SMALL_MACHINE, ctx=1024, parallel=1)
    large = can_run(sized_repo, machine=SMALL_MACHINE, ctx=8192, parallel=2)
    assert small.variants[0].kv_bytes == KV_BYTES_PER_TOKEN * 1024
    assert large.variants[0].kv_bytes == KV_BYTES_PER_TOKEN * 8192 * 2


def test_only_the_header_is_read_with_a_ranged_request(hub: HubServer, sized_repo: str) -> None:
    can_run(sized_repo, machine=SMALL_MACHINE)

    reads = hub.downloads(".gguf")
    assert len(reads) == 1
    assert reads[0].path.endswith("Tiny-Q4_K_M.gguf")
    assert reads[0].range == f"bytes=0-{HEADER_PREFIX_BYTES - 1}"
    assert reads[0].body_bytes <= HEADER_PREFIX_BYTES


def test_a_machine_where_nothing_fits_gets_no_pull_command(hub: HubServer, sized_repo: str) -> None:
    tiny_machine = MachineMemory(ram_total=1 * GiB, ram_available=GiB // 2)
    report = can_run(sized_repo, machine=tiny_machine)
    assert {v.verdict for v in report.variants} == {"too large"}
    assert report.best is None and report.pull_command is None
    assert "nothing here fits this machine" in format_report(report)


def test_gpu_memory_is_what_counts_when_there_is_a_gpu(hub: HubServer, sized_repo: str) -> None:
    with_gpu = MachineMemory(ram_total=8 * GiB, ram_available=5 * GiB, gpu_total=24 * GiB, gpu_name="GPU")
    report = can_run(sized_repo, machine=with_gpu)
    assert [v.verdict for v in report.variants] == ["comfortable"] * 4
    assert report.best.tag == "Q8_0"  # full precision only when no quant fits comfortably


def test_a_named_quant_is_the_only_variant_priced(hub: HubServer, sized_repo: str) -> None:
    report = can_run("hf.co/o/Tiny-GGUF:q8_0", machine=SMALL_MACHINE)
    assert [v.tag for v in report.variants] == ["Q8_0"]
    assert report.best.tag == "Q8_0"  # tight, but the one asked about


def qwen3_5_config(layers: int = 8, interval: int = 4) -> dict:
    return {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": 256,
            "num_hidden_layers": layers,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "full_attention_interval": interval,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "linear_conv_kernel_dim": 4,
            "max_position_embeddings": 32768,
            "torch_dtype": "bfloat16",
        },
    }


def test_a_hybrid_counts_kv_for_attention_layers_and_fixed_state_for_the_rest(hub: HubServer) -> None:
    hub.repos["Qwen/Tiny-Qwen3.5"] = FakeRepo(mlx_repo_files(qwen3_5_config(layers=8, interval=4)))

    short = can_run("Qwen/Tiny-Qwen3.5", machine=SMALL_MACHINE, ctx=4096, parallel=4)
    long = can_run("Qwen/Tiny-Qwen3.5", machine=SMALL_MACHINE, ctx=8192, parallel=4)

    assert short.mlx is True and short.llama_cpp is None and short.architecture == "qwen3_5"
    shape = short.shape
    assert (shape.attention_layers, shape.recurrent_layers) == (2, 6)
    # attention layers: 2 KV heads x 64 (K and V) in bf16 per token
    assert short.variants[0].kv_bytes == 2 * 2 * 64 * 2 * 2 * 4096 * 4
    # GatedDeltaNet: conv state (kernel-1) x (2 x key dim + value dim) in bf16, recurrent state
    # value heads x key dim x value dim in f32, per layer and row, however long the context
    conv = 3 * (2 * 4 * 32 + 8 * 32) * 2
    recurrent = 8 * 32 * 32 * 4
    assert short.variants[0].state_bytes == 6 * (conv + recurrent) * 4
    assert long.variants[0].kv_bytes == 2 * short.variants[0].kv_bytes
    assert long.variants[0].state_bytes == short.variants[0].state_bytes
    assert short.variants[0].tag == "safetensors (bf16)"
    assert short.pull_command == "kinfer pull hf.co/Qwen/Tiny-Qwen3.5"


def test_a_safetensors_repo_mlx_cannot_serve_is_priced_but_not_recommended(
    hub: HubServer, gguf_bytes
) -> None:
    config = {"model_type": "t5", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    hub.repos["google/tiny-bert"] = FakeRepo(mlx_repo_files(config))
    hub.repos["someone/tiny-bert-GGUF"] = FakeRepo({"tiny-bert-Q4_K_M.gguf": gguf_bytes()})

    report = can_run("google/tiny-bert", machine=SMALL_MACHINE)

    assert report.mlx is False
    assert report.variants[0].servable is False
    assert report.best is None
    assert report.suggestions == ("someone/tiny-bert-GGUF",)
    assert any("mlx-lm has no model for model_type 't5'" in n for n in report.notes)


def test_a_repo_with_no_weights_is_refused(hub: HubServer) -> None:
    hub.repos["o/empty"] = FakeRepo({"README.md": b"nothing here"})
    with pytest.raises(UnsupportedModel, match="no GGUF or safetensors weights"):
        can_run("o/empty", machine=SMALL_MACHINE)


def test_the_report_serialises_to_json(hub: HubServer, sized_repo: str) -> None:
    data = json.loads(json.dumps(can_run(sized_repo, machine=SMALL_MACHINE).to_dict()))
    assert data["repo"] == "o/Tiny-GGUF"
    assert data["supported"] == {"llama.cpp": True, "mlx": None}
    assert data["machine"]["usable"] == 5 * GiB
    assert [v["verdict"] for v in data["variants"]] == ["comfortable", "comfortable", "tight", "too large"]
    assert data["pull_command"] == "kinfer pull hf.co/o/Tiny-GGUF:q4_k_m"
    assert data["shape"]["layers"] == 2 and data["shape"]["kv_heads"] == KV_HEADS


def test_hosts_price_each_host_s_share_of_the_split_model(hub: HubServer, sized_repo: str) -> None:
    hub.repos["Qwen/Tiny-Qwen3.5"] = FakeRepo(mlx_repo_files(qwen3_5_config(layers=8, interval=4)))
    one = can_run("Qwen/Tiny-Qwen3.5", machine=SMALL_MACHINE, ctx=4096, parallel=4)
    two = can_run("Qwen/Tiny-Qwen3.5", machine=SMALL_MACHINE, ctx=4096, parallel=4, hosts=2)

    whole, half = one.variants[0], two.variants[0]
    assert two.hosts == 2 and two.to_dict()["hosts"] == 2
    assert half.weights_bytes == whole.weights_bytes // 2
    assert (half.kv_bytes, half.state_bytes) == (whole.kv_bytes // 2, whole.state_bytes // 2)
    assert half.servable and two.pull_command == one.pull_command
    # its 2 KV heads do not split 4 ways; a GGUF is never split
    four = can_run("Qwen/Tiny-Qwen3.5", machine=SMALL_MACHINE, hosts=4)
    assert not four.variants[0].servable and any("KV heads" in n for n in four.notes)
    gguf = can_run(sized_repo, machine=SMALL_MACHINE, hosts=2)
    assert gguf.best is None and any("only MLX" in n for n in gguf.notes)
