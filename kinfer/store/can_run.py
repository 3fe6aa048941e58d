"""`kinfer can-run REF`: will a model fit this machine? Answered without downloading weights.

For each variant (every GGUF quant, or the safetensors total of an MLX directory) the memory needed is
weights + KV cache for `ctx` tokens x `parallel` rows + fixed recurrent state per row + a runtime
overhead, set against this machine's memory. The model's shape comes from config.json or from the
GGUF header, read with a ranged request for its first megabytes.
"""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Literal

from kinfer.engines.embedding import EMBED_BATCH_TOKENS, MAX_EMBED_TOKENS
from kinfer.store.gguf_header import GGUFFormatError, NeedMoreBytes, parse_gguf_header
from kinfer.store.hub import GGUFVariant, HubClient, RepoListing
from kinfer.store.model_shape import ModelShape, shape_from_config, shape_from_gguf
from kinfer.store.progress import format_bytes
from kinfer.store.pull_plan import UnsupportedModel, is_embedding_repo, read_config, select_gguf
from kinfer.store.refs import HubRef, dir_model_name, gguf_model_name, parse_ref
from kinfer.store.support import llama_cpp_supports, mlx_support

logger = logging.getLogger(__name__)

DEFAULT_CTX = 4096
DEFAULT_PARALLEL = 4
# runtime cost beyond weights and cache: compute buffers, the tokenizer, the Python process
OVERHEAD_BYTES = 384 * 1024 * 1024
OVERHEAD_SHARE = 0.05
# needed <= this share of usable memory is comfortable; up to all of it is tight
COMFORTABLE_SHARE = 0.7
HEADER_PREFIX_BYTES = 4 * 1024 * 1024
HEADER_MAX_BYTES = 64 * 1024 * 1024
FULL_PRECISION_TAGS = frozenset({"F32", "F16", "BF16", "FP16", "FP32"})

Verdict = Literal["comfortable", "tight", "too large"]


@dataclass(frozen=True)
class MachineMemory:
    """The memory a model may use on this machine (bytes). Inject one in tests."""

    ram_total: int
    ram_available: int
    gpu_total: int | None = None  # CUDA VRAM, or Metal's recommended working set on Apple silicon
    gpu_name: str | None = None

    @property
    def usable(self) -> int:
        """What a model can count on: the GPU's memory when there is one, else the RAM free now."""
        return self.gpu_total or self.ram_available

    @classmethod
    def detect(cls) -> MachineMemory:
        import psutil

        vm = psutil.virtual_memory()
        gpu_total, gpu_name = _detect_gpu()
        return cls(ram_total=vm.total, ram_available=vm.available, gpu_total=gpu_total, gpu_name=gpu_name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ram_total": self.ram_total,
            "ram_available": self.ram_available,
            "gpu_total": self.gpu_total,
            "gpu_name": self.gpu_name,
            "usable": self.usable,
        }


def _detect_gpu() -> tuple[int | None, str | None]:
    if platform.system() == "Darwin":
        try:  # MLX reports Metal's working set; imported here only, so the store loads anywhere
            import mlx.core as mx

            info = mx.device_info()
            size = info.get("max_recommended_working_set_size") or info.get("memory_size")
            return (int(size), str(info.get("device_name", "Apple GPU"))) if size else (None, None)
        except Exception as exc:  # no MLX, or no Metal: fall back to RAM
            logger.debug("no Metal memory figure: %s", exc)
            return None, None
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total,name", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout
            rows = [line.split(",", 1) for line in out.strip().splitlines() if line.strip()]
            if rows:
                return sum(int(r[0]) for r in rows) * 1024 * 1024, rows[0][1].strip()
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            logger.debug("nvidia-smi gave no memory figure: %s", exc)
    return None, None


@dataclass(frozen=True)
class VariantFit:
    """One way to run the model, and whether it fits."""

    tag: str  # "Q4_K_M", or "safetensors (bf16)"
    format: Literal["gguf", "mlx"]
    files: int
    weights_bytes: int
    kv_bytes: int
    state_bytes: int
    overhead_bytes: int
    verdict: Verdict
    pull_ref: str
    servable: bool  # the engine for this format knows the architecture

    @property
    def needed_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.state_bytes + self.overhead_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "format": self.format,
            "files": self.files,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "state_bytes": self.state_bytes,
            "overhead_bytes": self.overhead_bytes,
            "needed_bytes": self.needed_bytes,
            "verdict": self.verdict,
            "servable": self.servable,
            "pull": self.pull_ref,
        }


@dataclass(frozen=True)
class CanRunReport:
    """Everything `can-run` found out about one repo."""

    repo_id: str
    commit: str | None
    ctx: int
    parallel: int
    machine: MachineMemory
    architecture: str | None
    llama_cpp: bool | None  # None: not a GGUF repo (or not told)
    mlx: bool | None  # None: not a safetensors repo
    shape: ModelShape | None
    variants: tuple[VariantFit, ...]
    best: VariantFit | None
    notes: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()
    hosts: int = 1  # the figures are per host: weights, KV and state split this many ways

    @property
    def pull_command(self) -> str | None:
        return f"kinfer pull {self.best.pull_ref}" if self.best else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo": self.repo_id,
            "commit": self.commit,
            "ctx": self.ctx,
            "parallel": self.parallel,
            "hosts": self.hosts,
            "machine": self.machine.to_dict(),
            "architecture": self.architecture,
            "supported": {"llama.cpp": self.llama_cpp, "mlx": self.mlx},
            "shape": self.shape.to_dict() if self.shape else None,
            "variants": [v.to_dict() for v in self.variants],
            "best": self.best.tag if self.best else None,
            "pull_command": self.pull_command,
            "notes": list(self.notes),
            "suggestions": list(self.suggestions),
        }


def verdict_for(needed: int, machine: MachineMemory) -> Verdict:
    usable = machine.usable
    if needed <= usable * COMFORTABLE_SHARE:
        return "comfortable"
    return "tight" if needed <= usable else "too large"


def can_run(
    ref: str | HubRef,
    *,
    machine: MachineMemory | None = None,
    ctx: int = DEFAULT_CTX,
    parallel: int = DEFAULT_PARALLEL,
    client: HubClient | None = None,
    hosts: int = 1,
) -> CanRunReport:
    """Estimate, per variant of `ref`, the memory needed for `ctx` x `parallel` and whether it fits.
    `hosts` > 1: per host of a distributed server (`--distributed`), the model split that many ways
    (MLX tensor parallel: weights, KV heads and recurrent state divided, a runtime overhead on each)."""
    hub_ref = parse_ref(ref) if isinstance(ref, str) else ref
    client = client or HubClient()
    machine = machine or MachineMemory.detect()
    listing = client.listing(hub_ref.repo_id, hub_ref.revision)
    variants = listing.gguf_variants()
    if hub_ref.filename or hub_ref.selector:
        wanted = hub_ref.filename or hub_ref.selector
        variants = [select_gguf(variants, wanted)] if variants else []
    common = {
        "repo_id": listing.repo_id,
        "commit": listing.commit,
        "ctx": ctx,
        "parallel": parallel,
        "machine": machine,
        "hosts": max(1, hosts),
    }
    if variants:
        return _gguf_report(client, listing, variants, common)
    return _safetensors_report(client, listing, common)


def _gguf_report(
    client: HubClient, listing: RepoListing, variants: list[GGUFVariant], common: dict[str, Any]
) -> CanRunReport:
    probe = select_gguf(variants, None)
    notes = []
    try:
        header = _remote_header(client, listing, probe)
        shape = shape_from_gguf(header)
        architecture = header.architecture
    except GGUFFormatError as exc:
        shape, architecture = None, None
        notes.append(f"could not read the GGUF header of {probe.first.path}: {exc}")
    supported = llama_cpp_supports(architecture)
    embedding = architecture is not None and isinstance(header.arch_value("pooling_type"), int)
    if embedding:
        notes.append("an embedding model: sized for one embedding pass, not for chat rows")
    if shape is None:
        notes.append("model shape unknown: the estimate counts weights and overhead only")
    elif shape.context_length and common["ctx"] > shape.context_length:
        notes.append(
            f"the model was trained for {shape.context_length} tokens, less than --ctx {common['ctx']}"
        )
    if supported is False:
        notes.append(f"llama.cpp does not know the architecture {architecture!r}")
    if common["hosts"] > 1:
        notes.append("a GGUF runs on one machine: only MLX directories are split across hosts")
    fits = tuple(
        _fit(
            v.tag,
            "gguf",
            len(v.files),
            v.size,
            shape,
            common,
            gguf_model_name(listing.repo_id, v.tag),
            supported is not False and common["hosts"] == 1,
            embedding,
        )
        for v in sorted(variants, key=lambda v: v.size)
    )
    return CanRunReport(
        **common,
        architecture=architecture,
        llama_cpp=supported,
        mlx=None,
        shape=shape,
        variants=fits,
        best=best_fit(fits),
        notes=tuple(notes),
    )


def _safetensors_report(client: HubClient, listing: RepoListing, common: dict[str, Any]) -> CanRunReport:
    weights = listing.safetensors()
    config = read_config(client, listing) if weights else None
    if not weights or config is None:
        what = "no GGUF or safetensors weights" if not weights else "safetensors but no usable config.json"
        raise UnsupportedModel(
            f"{listing.repo_id} has {what}",
            tuple(client.search_gguf(listing.repo_id.split("/")[1], exclude=listing.repo_id)),
        )
    embedding = is_embedding_repo(listing, config)
    support = mlx_support(config, embedding=embedding)
    shape = shape_from_config(config)
    notes, suggestions = [], ()
    if embedding:
        notes.append("an embedding model: sized for one embedding pass, not for chat rows")
    if not support.supported:
        notes.append(f"MLX cannot serve it: {support.reason}")
        suggestions = tuple(client.search_gguf(listing.repo_id.split("/")[1], exclude=listing.repo_id))
    if shape is None:
        notes.append("model shape unknown: the estimate counts weights and overhead only")
    split = split_note(support.model_type, shape, common["hosts"]) if support.supported else None
    if split:
        notes.append(split)
    fit = _fit(
        _dir_label(config),
        "mlx",
        len(weights),
        sum(f.size for f in weights),
        shape,
        common,
        dir_model_name(listing.repo_id),
        support.supported and not (common["hosts"] > 1 and (embedding or split)),
        embedding,
    )
    return CanRunReport(
        **common,
        architecture=support.model_type,
        llama_cpp=None,
        mlx=support.supported,
        shape=shape,
        variants=(fit,),
        best=best_fit((fit,)),
        notes=tuple(notes),
        suggestions=suggestions,
    )


def _dir_label(config: dict[str, Any]) -> str:
    quant = config.get("quantization")
    if isinstance(quant, dict) and quant.get("bits"):
        return f"safetensors ({quant['bits']}-bit)"
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    names = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
    return f"safetensors ({names.get(dtype, dtype)})" if dtype else "safetensors"


def _fit(
    tag: str,
    fmt: Literal["gguf", "mlx"],
    files: int,
    weights: int,
    shape: ModelShape | None,
    common: dict[str, Any],
    pull_ref: str,
    servable: bool,
    embedding: bool = False,
) -> VariantFit:
    ctx, rows = common["ctx"], common["parallel"]
    if embedding:  # no rows: one embedding pass's tokens (see kinfer/engines/embedding.py)
        ctx, rows = embedding_pass_tokens(shape.context_length if shape else None), 1
    hosts = common.get("hosts", 1)
    weights = weights // hosts  # tensor parallel: each host holds its share (embedding and head are whole
    # on some architectures: a small underestimate for large models)
    kv = (shape.kv_bytes(ctx, rows) if shape else 0) // hosts
    state = (shape.state_bytes(rows) if shape else 0) // hosts
    overhead = OVERHEAD_BYTES + int(weights * OVERHEAD_SHARE)
    return VariantFit(
        tag=tag,
        format=fmt,
        files=files,
        weights_bytes=weights,
        kv_bytes=kv,
        state_bytes=state,
        overhead_bytes=overhead,
        verdict=verdict_for(weights + kv + state + overhead, common["machine"]),
        pull_ref=pull_ref,
        servable=servable,
    )


def split_note(model_type: str | None, shape: ModelShape | None, hosts: int) -> str | None:
    """Why this model cannot be split `hosts` ways (None: it can, or hosts is 1)."""
    if hosts <= 1:
        return None
    from kinfer.distributed.splits import tensor_parallel

    if tensor_parallel(model_type) is False:
        return f"mlx-lm has no tensor-parallel split for {model_type!r}: it cannot be served across hosts"
    if shape is not None and shape.kv_heads and shape.kv_heads % hosts:
        return f"its {shape.kv_heads} KV heads do not split {hosts} ways"
    return None


def embedding_pass_tokens(context_length: int | None) -> int:
    """Tokens of one embedding pass: the longest input, at least a full batch of short ones."""
    return max(min(context_length or MAX_EMBED_TOKENS, MAX_EMBED_TOKENS), EMBED_BATCH_TOKENS)


def best_fit(fits: tuple[VariantFit, ...]) -> VariantFit | None:
    """The largest comfortable variant (full precision only when no quant fits comfortably), else the
    smallest tight one; None when nothing servable fits."""
    servable = [f for f in fits if f.servable]
    comfortable = [f for f in servable if f.verdict == "comfortable"]
    quantized = [f for f in comfortable if f.tag.upper() not in FULL_PRECISION_TAGS]
    pool = quantized or comfortable
    if pool:
        # the best quality that still leaves room
        return max(pool, key=lambda f: f.weights_bytes)
    tight = [f for f in servable if f.verdict == "tight"]
    return min(tight, key=lambda f: f.needed_bytes) if tight else None


def _remote_header(client: HubClient, listing: RepoListing, variant: GGUFVariant):
    """The GGUF header of a variant's first shard, from a ranged request (more only if needed)."""
    first = variant.first
    want = min(HEADER_PREFIX_BYTES, first.size)
    revision = listing.commit or listing.revision
    while True:
        data = client.fetch(listing.repo_id, first.path, revision, start=0, end=want)
        try:
            return parse_gguf_header(data)
        except NeedMoreBytes as more:
            if len(data) >= first.size or want >= HEADER_MAX_BYTES:
                raise GGUFFormatError(f"header longer than {format_bytes(want)}") from None
            want = min(max(more.needed + 65536, want * 2), HEADER_MAX_BYTES, first.size)


def format_report(report: CanRunReport) -> str:
    """The report as `kinfer can-run` prints it."""
    m = report.machine
    lines = []
    engines = []
    if report.llama_cpp is not None:
        engines.append("llama.cpp: " + ("yes" if report.llama_cpp else "no"))
    if report.mlx is not None:
        engines.append("MLX: " + ("yes" if report.mlx else "no"))
    arch = report.architecture or "unknown architecture"
    lines.append(f"{report.repo_id} ({arch}; {', '.join(engines) or 'engine support unknown'})")
    if report.shape:
        s = report.shape
        layers = f"{s.layers} layers ({s.attention_layers} attention"
        layers += f", {s.recurrent_layers} recurrent)" if s.recurrent_layers else ")"
        trained = f", trained for {s.context_length} tokens" if s.context_length else ""
        lines.append(f"shape: {layers}, {s.kv_heads} KV heads x {s.head_dim}{trained}")
    gpu = f", GPU {m.gpu_name or ''} {format_bytes(m.gpu_total)}" if m.gpu_total else ""
    per_host = f", per host of {report.hosts} (split)" if report.hosts > 1 else ""
    lines.append(
        f"estimate for {report.ctx} tokens x {report.parallel} rows{per_host}; this machine: "
        f"{format_bytes(m.ram_available)} RAM free of {format_bytes(m.ram_total)}{gpu}"
    )
    lines.append("")
    header = ("VARIANT", "FILES", "WEIGHTS", "KV+STATE", "NEEDED", "VERDICT")
    rows = [header] + [
        (
            v.tag + ("" if v.servable else " (unsupported)"),
            str(v.files),
            format_bytes(v.weights_bytes),
            format_bytes(v.kv_bytes + v.state_bytes),
            format_bytes(v.needed_bytes),
            v.verdict,
        )
        for v in report.variants
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    lines += [f"note: {n}" for n in report.notes]
    if report.suggestions:
        lines.append("GGUF conversions on the hub: " + ", ".join(report.suggestions))
    if report.pull_command:
        lines.append(f"best fit: {report.pull_command}")
    else:
        lines.append("nothing here fits this machine" if report.variants else "nothing to run")
    return "\n".join(lines)
