"""Random-weight models for the GPU benchmarks: one HF folder (MLX) and one GGUF (llama.cpp) per shape.

    python scripts/bench_models.py OUT qwen3-0.6b qwen3.5-0.8b          # OUT/<size>/ and OUT/<size>.gguf
    python scripts/bench_models.py OUT qwen3-0.6b --tiny               # seconds on a CPU (a smoke test)

Shapes come from scripts/bench_mlx_engine.py (SHAPES / TINY) and the HF folder from its
`build_model_dir`. The GGUF is written here in llama.cpp's layout (arch `qwen3` or `qwen35`), with
random weights of the same shapes and dtype: tok/s does not depend on the values. Both get the same
tokenizer, a byte-level BPE over the whole vocabulary (256 byte tokens, fillers, then the ChatML
special tokens at the top), so every engine and server reads a prompt as the same number of tokens,
and the same ChatML chat template.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
GGUF_ARCH = {"qwen3": "qwen3", "qwen3_5": "qwen35"}
CONTEXT = 32768
WEIGHT_SCALE = 0.02


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def token_list(vocab: int) -> list[str]:
    fillers = vocab - 256 - 1 - len(SPECIALS)
    return [*byte_chars(), "Ġt", *(f"w{i}" for i in range(fillers)), *SPECIALS]


def write_tokenizer(folder: Path, tokens: list[str]) -> None:
    """Replace the folder's tokenizer with the byte-level one the GGUF carries, plus ChatML."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "chat_template": CHATML,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def gguf_tensors(text: dict, arch: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor llama.cpp loads for this config (shapes = ggml ne reversed)."""
    e, layers, ff = text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"]
    heads, kv, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    tensors = [("token_embd.weight", (text["vocab_size"], e)), ("output_norm.weight", (e,))]
    interval = text.get("full_attention_interval", 1)
    for i in range(layers):
        b = f"blk.{i}."
        tensors.append((b + "attn_norm.weight", (e,)))
        recurrent = arch == "qwen35" and (i + 1) % interval != 0
        if arch == "qwen3":
            tensors += [(b + "attn_q.weight", (heads * hd, e)), (b + "ffn_norm.weight", (e,))]
        else:
            tensors.append((b + "post_attention_norm.weight", (e,)))
        if recurrent:
            k_heads, v_heads = text["linear_num_key_heads"], text["linear_num_value_heads"]
            k_dim, v_dim = text["linear_key_head_dim"], text["linear_value_head_dim"]
            conv = 2 * k_heads * k_dim + v_heads * v_dim
            tensors += [
                (b + "attn_qkv.weight", (conv, e)),
                (b + "attn_gate.weight", (v_heads * v_dim, e)),
                (b + "ssm_conv1d.weight", (conv, text["linear_conv_kernel_dim"])),
                (b + "ssm_dt.bias", (v_heads,)),
                (b + "ssm_a", (v_heads,)),
                (b + "ssm_beta.weight", (v_heads, e)),
                (b + "ssm_alpha.weight", (v_heads, e)),
                (b + "ssm_norm.weight", (v_dim,)),
                (b + "ssm_out.weight", (e, v_heads * v_dim)),
            ]
        else:
            if arch == "qwen35":  # the query projection carries the output gate too
                tensors.append((b + "attn_q.weight", (2 * heads * hd, e)))
            tensors += [
                (b + "attn_k.weight", (kv * hd, e)),
                (b + "attn_v.weight", (kv * hd, e)),
                (b + "attn_output.weight", (e, heads * hd)),
                (b + "attn_q_norm.weight", (hd,)),
                (b + "attn_k_norm.weight", (hd,)),
            ]
        tensors += [
            (b + "ffn_gate.weight", (ff, e)),
            (b + "ffn_up.weight", (ff, e)),
            (b + "ffn_down.weight", (e, ff)),
        ]
    return tensors


def write_gguf(path: Path, config: dict, dtype: str, tokens: list[str], seed: int = 0) -> Path:
    """Random weights in llama.cpp's layout for `config` (a qwen3 / qwen3_5 config.json)."""
    import gguf
    from gguf.quants import quantize

    text = config.get("text_config", config)
    arch = GGUF_ARCH[config["model_type"]]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name(f"random {config['model_type']}")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(text["hidden_size"])
    w.add_block_count(text["num_hidden_layers"])
    w.add_feed_forward_length(text["intermediate_size"])
    w.add_head_count(text["num_attention_heads"])
    w.add_head_count_kv(text["num_key_value_heads"])
    w.add_key_length(text["head_dim"])
    w.add_value_length(text["head_dim"])
    w.add_layer_norm_rms_eps(text["rms_norm_eps"])
    rope = text.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", text.get("rope_theta", 10000.0))))
    if arch == "qwen35":
        rope_dims = int(text["head_dim"] * rope.get("partial_rotary_factor", 0.25))
        sections = [*rope.get("mrope_section", [11, 11, 10]), 0][:4]
        if sum(sections) > rope_dims // 2:  # tiny shapes: too few rotary dims for Qwen's sections
            sections = [rope_dims // 2, 0, 0, 0]
        w.add_rope_dimension_count(rope_dims)
        w.add_rope_dimension_sections(sections)
        w.add_ssm_conv_kernel(text["linear_conv_kernel_dim"])
        w.add_ssm_state_size(text["linear_key_head_dim"])
        w.add_ssm_group_count(text["linear_num_key_heads"])
        w.add_ssm_time_step_rank(text["linear_num_value_heads"])
        w.add_ssm_inner_size(text["linear_value_head_dim"] * text["linear_num_value_heads"])
        w.add_full_attention_interval(text["full_attention_interval"])
    bf16 = dtype == "bfloat16"
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)
    for name, shape in gguf_tensors(text, arch):
        data = rng.standard_normal(shape, dtype=np.float32) * WEIGHT_SCALE
        if len(shape) == 1:
            # norms near 1 and a negative decay keep activations finite, as in a trained model
            data = (-np.abs(data) - 0.5) if name.endswith("ssm_a") else data + 1.0
            w.add_tensor(name, data.astype(np.float32))
        elif "ssm_conv1d" in name:  # ggml's ssm_conv reads f32 kernels only
            w.add_tensor(name, data)
        elif bf16:
            w.add_tensor(
                name, quantize(data, gguf.GGMLQuantizationType.BF16), raw_dtype=gguf.GGMLQuantizationType.BF16
            )
        else:
            w.add_tensor(name, data.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def build_pair(out: Path, size: str, *, dtype: str = "bfloat16", tiny: bool = False) -> tuple[Path, Path]:
    """(HF folder, GGUF) for `size`, built once into `out`."""
    import bench_mlx_engine as shapes

    config = (shapes.TINY if tiny else shapes.SHAPES)[size]
    folder, gguf_path = out / size, out / f"{size}.gguf"
    text = config.get("text_config", config)
    tokens = token_list(text["vocab_size"])
    if not (folder / "model.safetensors").is_file():
        shapes.build_model_dir(folder, config, dtype)
        write_tokenizer(folder, tokens)
    if not gguf_path.is_file():
        write_gguf(gguf_path.with_suffix(".tmp"), config, dtype, tokens).rename(gguf_path)
    return folder, gguf_path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("sizes", nargs="+", help="qwen3-0.6b, qwen3.5-0.8b")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for size in args.sizes:
        folder, gguf_path = build_pair(args.out, size, dtype=args.dtype, tiny=args.tiny)
        print(f"{size}: {folder} {gguf_path} ({gguf_path.stat().st_size / 2**20:.0f} MiB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
