"""`describe(model)`: what `kinfer show` and the server's `/api/show` report about a model.

Read from headers only: the GGUF header (see gguf_header.py), or for an MLX folder config.json,
the tokenizer config and the safetensors headers (8-byte length + JSON), never the weights.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kinfer.chat.traits import ToolFormat, analyze_template
from kinfer.engines.embedding import GGUF_POOLING, embedding_pooling
from kinfer.errors import StoreError
from kinfer.store.gguf_header import ArraySummary, GGUFFormatError, GGUFHeader, read_gguf_header
from kinfer.store.local import split_shards
from kinfer.store.manifest import ModelFormat
from kinfer.store.models import StoredModel

_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_DTYPE_LABELS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}


@dataclass(frozen=True)
class ModelFile:
    """One file of a model: path relative to the model folder (or the file name) and size."""

    path: str
    size: int


@dataclass(frozen=True)
class ModelDetails:
    """Traits of a model, read from its headers; shared by `kinfer show` and `/api/show`."""

    name: str
    format: ModelFormat
    engine: str
    source: str
    kind: str
    architecture: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    head_count: int | None
    head_count_kv: int | None
    vocab_size: int | None
    chat_template: str | None
    thinking: bool
    tool_format: ToolFormat  # hermes | qwen3_5_xml | default (kinfer's tool prompt) | none
    files: tuple[ModelFile, ...]
    size: int
    alias_of: str | None = None
    pooling: str | None = None  # an embedding model's pooling (mean, cls, last, max); None: generative

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    @property
    def parameter_label(self) -> str | None:
        """Parameters as model cards write them: 135M, 7.62B."""
        return human_number(self.parameters) if self.parameters else None

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Ollama's capability names: `embedding` alone for an embedding model (as Ollama decides it:
        a GGUF with `<arch>.pooling_type`; for a directory, sentence-transformers files or an encoder);
        else completion always, tools unless the template prints tools in a convention kinfer cannot
        parse back, thinking when the template has it."""
        if self.pooling is not None:
            return ("embedding",)
        caps = ["completion"]
        if self.tool_format != "none":
            caps.append("tools")
        if self.thinking:
            caps.append("thinking")
        return tuple(caps)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        data["parameter_label"] = self.parameter_label
        data["has_chat_template"] = self.has_chat_template
        data["capabilities"] = list(self.capabilities)
        return data


def human_number(n: int) -> str:
    """Three significant digits and a unit: 134515008 -> 135M, 7615616512 -> 7.62B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            text = f"{value:.{max(0, 2 - int(math.log10(value)))}f}"
            return (text.rstrip("0").rstrip(".") if "." in text else text) + unit
    return str(n)


def template_traits(template: str | None) -> tuple[bool, ToolFormat]:
    """(thinking support, tool-call convention) as far as the chat template shows them.

    A model without a template is served with kinfer's ChatML fallback and default tool prompt."""
    traits = analyze_template(template or None)
    return traits.supports_thinking or traits.has_think_switch, traits.tool_format


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return max(value)  # per-layer arrays (e.g. head_count_kv): the largest is the one that costs
    return None


def _files(model: StoredModel) -> tuple[ModelFile, ...]:
    # paths inside the model's own folder (a pulled split GGUF may keep its shards in a subfolder)
    root = model.folder or (model.path if model.format == "mlx" else None)
    out = []
    for f in model.files:
        try:
            size = f.stat().st_size
        except OSError:
            continue
        rel = str(f.relative_to(root)) if root is not None and f.is_relative_to(root) else f.name
        out.append(ModelFile(rel, size))
    return tuple(out)


def _describe_gguf(model: StoredModel) -> dict[str, Any]:
    shards = split_shards(model.path, model.files)
    try:
        headers: list[GGUFHeader] = [read_gguf_header(p) for p in shards]
    except (OSError, GGUFFormatError) as exc:
        raise StoreError(f"cannot read {model.name}: {exc}") from None
    head = headers[0]
    by_type: Counter[str] = Counter()
    for h in headers:
        by_type.update(h.elements_by_type())
    vocab = head.arch_value("vocab_size")
    tokens = head.get("tokenizer.ggml.tokens")
    if vocab is None and isinstance(tokens, (list, ArraySummary)):
        vocab = len(tokens) if isinstance(tokens, list) else tokens.length
    pooling = head.arch_value("pooling_type")
    return {
        "pooling": GGUF_POOLING.get(pooling) if isinstance(pooling, int) else None,
        "architecture": head.architecture,
        "parameters": sum(by_type.values()) or None,
        "quantization": head.file_type or (by_type.most_common(1)[0][0] if by_type else None),
        "context_length": _int(head.context_length),
        "embedding_length": _int(head.arch_value("embedding_length")),
        "block_count": _int(head.arch_value("block_count")),
        "head_count": _int(head.arch_value("attention.head_count")),
        "head_count_kv": _int(head.arch_value("attention.head_count_kv")),
        "vocab_size": _int(vocab),
        "chat_template": head.chat_template,
    }


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file: {tensor name: {dtype, shape, data_offsets}}."""
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise StoreError(f"{path}: not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_SAFETENSORS_HEADER:
            raise StoreError(f"{path}: safetensors header of {length} bytes: corrupt file")
        header = json.loads(fh.read(length))
    if not isinstance(header, dict):
        raise StoreError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def _quant_bits(quant: dict[str, Any], tensor_name: str) -> int:
    layer = tensor_name.removesuffix(".weight")
    override = quant.get(layer)
    if isinstance(override, dict) and isinstance(override.get("bits"), int):
        return override["bits"]
    bits = quant.get("bits")
    return bits if isinstance(bits, int) and bits > 0 else 4


def _safetensors_stats(files: list[Path], quant: dict[str, Any] | None) -> tuple[int, Counter[str]]:
    """Parameter count (unpacking MLX's quantized weights) and elements per dtype."""
    tensors: dict[str, dict[str, Any]] = {}
    for path in files:
        tensors.update(read_safetensors_header(path))
    total, dtypes = 0, Counter()
    for name, info in tensors.items():
        stem = name.rsplit(".", 1)[0]
        quantized = f"{stem}.scales" in tensors
        if quantized and name.endswith((".scales", ".biases")):
            continue  # quantization bookkeeping, not parameters
        count = math.prod(info.get("shape", []))
        if quantized and name.endswith(".weight"):
            # MLX packs 32 // bits values in every uint32
            count = count * 32 // _quant_bits(quant or {}, name)
        total += count
        dtypes[str(info.get("dtype", "?"))] += count
    return total, dtypes


def _mlx_template(folder: Path) -> str | None:
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str) and template:
        return template
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        legacy = json.loads((folder / "chat_template.json").read_text(encoding="utf-8"))
        return legacy.get("chat_template") if isinstance(legacy, dict) else None
    except (OSError, ValueError):
        return None


def _quant_label(quant: dict[str, Any]) -> str | None:
    bits = quant.get("bits")
    mode = quant.get("mode") or quant.get("quant_method")
    if isinstance(mode, str) and mode not in ("affine", ""):
        return mode.upper() if bits is None else f"{mode} {bits}-bit"
    return f"{bits}-bit" if bits else None


def _describe_mlx(model: StoredModel) -> dict[str, Any]:
    folder = model.path
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {model.name}: config.json: {exc}") from None
    if not isinstance(config, dict):
        raise StoreError(f"cannot read {model.name}: config.json is not a JSON object")
    # multimodal configs such as qwen3_5 keep the language model's numbers in text_config
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}

    def get(key: str) -> Any:
        return text.get(key, config.get(key))

    quant = config.get("quantization") or config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else None
    weights = sorted(p for p in model.files if p.suffix == ".safetensors")
    try:
        parameters, dtypes = _safetensors_stats(weights, quant)
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {model.name}: {exc}") from None
    if quant:
        quantization = _quant_label(quant)
    elif isinstance(dtype := get("torch_dtype") or get("dtype"), str):
        quantization = _DTYPE_LABELS.get(dtype, dtype.upper())
    else:
        quantization = dtypes.most_common(1)[0][0] if dtypes else None
    return {
        "pooling": embedding_pooling(folder, config),
        "architecture": config.get("model_type") or text.get("model_type"),
        "parameters": parameters or None,
        "quantization": quantization,
        "context_length": _int(get("max_position_embeddings")),
        "embedding_length": _int(get("hidden_size")),
        "block_count": _int(get("num_hidden_layers")),
        "head_count": _int(get("num_attention_heads")),
        "head_count_kv": _int(get("num_key_value_heads")),
        "vocab_size": _int(get("vocab_size")),
        "chat_template": _mlx_template(folder),
    }


def describe(model: StoredModel) -> ModelDetails:
    """Read a model's traits from its headers; raises StoreError when they cannot be read."""
    traits = _describe_gguf(model) if model.format == "gguf" else _describe_mlx(model)
    thinking, tool_format = template_traits(traits["chat_template"])
    return ModelDetails(
        name=model.name,
        format=model.format,
        engine=model.engine,
        source=model.source,
        kind=model.kind_label,
        thinking=thinking,
        tool_format=tool_format,
        files=_files(model),
        size=model.size,
        alias_of=model.alias_of,
        **traits,
    )
