"""How much per-row state a model keeps, from its config.json or its GGUF header.

Attention layers keep K and V for every token of the row; the recurrent layers of hybrids (qwen3_5's
GatedDeltaNet, Mamba) keep a fixed state per row however long it grows. `ModelShape` holds both as
per-token and per-row byte counts, so `can-run` can price any context length and row count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kinfer.store.gguf_header import GGUFHeader

KV_BYTES = 2  # f16 / bf16 K and V: llama.cpp's default cache type, and MLX's dtype for bf16 weights
STATE_BYTES = 4  # recurrent states are kept in float32 by both engines


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model's shape that decide its per-row memory."""

    architecture: str
    layers: int
    attention_layers: int
    kv_heads: int  # per attention layer (the largest, when layers differ)
    head_dim: int  # K width per head (V may differ; kv_values_per_token has the exact sum)
    kv_values_per_token: int  # K and V values one token adds across every attention layer
    recurrent_layers: int = 0
    state_bytes_per_row: int = 0  # fixed state of all recurrent layers for one row
    context_length: int | None = None  # what the model was trained for

    def kv_bytes(self, ctx: int, rows: int) -> int:
        return self.kv_values_per_token * KV_BYTES * ctx * rows

    def state_bytes(self, rows: int) -> int:
        return self.state_bytes_per_row * rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "layers": self.layers,
            "attention_layers": self.attention_layers,
            "recurrent_layers": self.recurrent_layers,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "context_length": self.context_length,
        }


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def shape_from_config(config: dict[str, Any]) -> ModelShape | None:
    """The shape a Hugging Face config.json describes (text_config for multimodal/hybrid wrappers)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    cfg = {**config, **text} if text else config
    layers = _int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers"))
    heads = _int(cfg.get("num_attention_heads") or cfg.get("n_head"))
    hidden = _int(cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model"))
    if not layers or not heads or not hidden:
        return None
    kv_heads = _int(cfg.get("num_key_value_heads"), heads) or heads
    head_dim = _int(cfg.get("head_dim")) or hidden // heads
    recurrent = _recurrent_layer_count(cfg, layers)
    attention = layers - recurrent
    state = 0
    if recurrent:
        k_heads = _int(cfg.get("linear_num_key_heads"))
        v_heads = _int(cfg.get("linear_num_value_heads"))
        k_dim = _int(cfg.get("linear_key_head_dim"))
        v_dim = _int(cfg.get("linear_value_head_dim"))
        conv_kernel = _int(cfg.get("linear_conv_kernel_dim"), 4)
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        per_layer = (conv_kernel - 1) * conv_dim * KV_BYTES + v_heads * k_dim * v_dim * STATE_BYTES
        state = recurrent * per_layer
    context = _int(cfg.get("max_position_embeddings")) or None
    return ModelShape(
        architecture=str(config.get("model_type") or cfg.get("model_type") or "unknown"),
        layers=layers,
        attention_layers=attention,
        kv_heads=kv_heads,
        head_dim=head_dim,
        kv_values_per_token=attention * kv_heads * head_dim * 2,
        recurrent_layers=recurrent,
        state_bytes_per_row=state,
        context_length=context,
    )


def _recurrent_layer_count(cfg: dict[str, Any], layers: int) -> int:
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return sum(1 for t in layer_types if t in ("linear_attention", "mamba", "recurrent"))
    interval = _int(cfg.get("full_attention_interval"))
    if interval > 1 and "linear_num_value_heads" in cfg:
        # qwen3_next / qwen3_5: every interval-th layer is full attention, the rest GatedDeltaNet
        return sum(1 for i in range(layers) if (i + 1) % interval != 0)
    return 0


def shape_from_gguf(header: GGUFHeader) -> ModelShape | None:
    """The shape a GGUF header describes (llama.cpp's `<arch>.*` keys)."""
    arch = header.architecture
    if not arch:
        return None
    layers = _int(header.arch_value("block_count"))
    heads_raw = header.arch_value("attention.head_count")
    kv_raw = header.arch_value("attention.head_count_kv")
    hidden = _int(header.arch_value("embedding_length"))
    heads = _per_layer(heads_raw, layers)
    kv = _per_layer(kv_raw, layers) if kv_raw is not None else heads
    if not layers or not any(heads):
        return None
    max_heads = max(heads)
    key_len = _int(header.arch_value("attention.key_length")) or (hidden // max_heads if hidden else 0)
    value_len = _int(header.arch_value("attention.value_length")) or key_len
    interval = _int(header.arch_value("full_attention_interval"))
    d_state = _int(header.arch_value("ssm.state_size"))
    if interval > 1 and d_state:
        recurrent_idx = {i for i in range(layers) if (i + 1) % interval != 0}
    elif isinstance(kv_raw, list) and d_state:
        # hybrids (jamba, lfm2, granitehybrid) give their recurrent layers 0 KV heads
        recurrent_idx = {i for i, n in enumerate(kv) if n == 0}
    elif d_state and not any(kv):
        recurrent_idx = set(range(layers))
    else:
        recurrent_idx = set()
    attention_idx = [i for i in range(layers) if i not in recurrent_idx]
    state = 0
    if recurrent_idx:
        d_conv = _int(header.arch_value("ssm.conv_kernel"), 4)
        d_inner = _int(header.arch_value("ssm.inner_size"))
        n_group = _int(header.arch_value("ssm.group_count"), 1) or 1
        conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
        ssm = d_state * d_inner
        state = len(recurrent_idx) * (conv + ssm) * STATE_BYTES
    return ModelShape(
        architecture=arch,
        layers=layers,
        attention_layers=len(attention_idx),
        kv_heads=max((kv[i] for i in attention_idx), default=0),
        head_dim=key_len,
        kv_values_per_token=sum(kv[i] for i in attention_idx) * (key_len + value_len),
        recurrent_layers=len(recurrent_idx),
        state_bytes_per_row=state,
        context_length=header.context_length,
    )


def _per_layer(value: Any, layers: int) -> list[int]:
    if isinstance(value, list):
        values = [_int(v) for v in value]
        return values + [values[-1] if values else 0] * (layers - len(values))
    return [_int(value)] * layers
