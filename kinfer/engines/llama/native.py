"""Thin, typed wrappers over llama-cpp-python's low-level (ctypes) API, for the llama.cpp engine.

Only `kinfer.engines.llama*` modules import this one: importing it loads libllama.
What lives here: routing llama.cpp's log into a Python logger, loading a model and reading the facts
kinfer needs from it, the vocabulary (tokenize / detokenize / token pieces), a reusable token batch,
a row's logits, per-sequence memory and the context. The sampler chain is in samplers.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp as lib  # isort: skip

from kinfer.engines.llama.invariant_attention import batch_invariant_cpu_flash_attention
from kinfer.engines.llama.memory import BufferSizes, parse_buffer_sizes
from kinfer.errors import EngineFailure

native_log = logging.getLogger("kinfer.llama_cpp")

# ggml_log_level values (ggml.h)
_LEVEL_WARN, _LEVEL_ERROR, _LEVEL_CONT = 3, 4, 5
_PY_LEVEL = {_LEVEL_WARN: logging.WARNING, _LEVEL_ERROR: logging.ERROR}
BYTES_PER_KV_VALUE = 2  # the context's default K/V cache type is f16


class _LogRouter:
    """Collects llama.cpp's log fragments into lines for `native_log` (llama.cpp writes to stderr
    otherwise, which would scribble over the dashboard). Each engine thread has its own line."""

    def __init__(self) -> None:
        self._line = threading.local()
        self.captured = threading.local()  # .lines: a list while `capture_log` runs on this thread
        # the C side keeps only the function pointer: this object must outlive every model
        self.callback = lib.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes | None, _user_data: object) -> None:
        line = self._line
        if level != _LEVEL_CONT or not hasattr(line, "parts"):
            self._flush()
            line.parts = []
            line.level = _PY_LEVEL.get(level, logging.DEBUG)
            # llama.cpp logs a few debug lines per decode: drop them early unless someone listens
            capturing = getattr(self.captured, "lines", None) is not None
            line.keep = capturing or native_log.isEnabledFor(line.level)
        if not line.keep:
            return
        line.parts.append((text or b"").decode("utf-8", errors="replace"))
        if line.parts[-1].endswith("\n"):
            self._flush()

    def _flush(self) -> None:
        line = self._line
        text = "".join(getattr(line, "parts", ())).rstrip()
        line.parts = []
        if text:
            native_log.log(line.level, "%s", text)
            lines = getattr(self.captured, "lines", None)
            if lines is not None:
                lines.append(text)


_router: _LogRouter | None = None


def init_backend() -> None:
    """Route llama.cpp's logging into `kinfer.llama_cpp` and initialise its backends (once)."""
    global _router
    if _router is None:
        _router = _LogRouter()
        lib.llama_log_set(_router.callback, ctypes.c_void_p(0))
        lib.llama_backend_init()


@contextlib.contextmanager
def capture_log() -> Iterator[list[str]]:
    """The lines llama.cpp logs on this thread while the block runs (at any level)."""
    init_backend()
    assert _router is not None
    lines: list[str] = []
    _router.captured.lines = lines
    try:
        yield lines
    finally:
        _router._flush()
        _router.captured.lines = None


# bytes of the buffers llama.cpp reported allocating for each model and context, by pointer
_buffers: dict[int, BufferSizes] = {}
# whether each context runs flash attention: llama.cpp logs `flash_attn = enabled`, or for `auto`
# `flash_attn = auto` and then "Flash Attention enabled" once its probe of the devices resolved it
_flash_attention: dict[int, bool] = {}
_FLASH_ON = re.compile(r"flash_attn\s*=\s*enabled\b|Flash Attention enabled\b")


def buffer_sizes(pointer: int) -> BufferSizes:
    """What llama.cpp said it allocated for a model or context made by this module (empty if unknown)."""
    return _buffers.get(pointer, BufferSizes())


def supports_gpu_offload() -> bool:
    return bool(lib.llama_supports_gpu_offload())


def max_sequences() -> int:
    return int(lib.llama_max_parallel_sequences())


@dataclass(frozen=True)
class ModelFacts:
    """What the engine reads from a loaded GGUF model."""

    architecture: str
    chat_template: str | None
    train_context: int
    n_layer: int
    kv_bytes_per_token: int  # f16 K and V, all layers (attention layers of hybrids are over-counted)
    recurrent: bool
    hybrid: bool
    model_bytes: int


def load_model(path: Path, gpu_layers: int) -> int:
    """Load a GGUF file; returns the llama_model pointer. Raises EngineFailure if llama.cpp refuses it."""
    params = lib.llama_model_default_params()
    params.n_gpu_layers = gpu_layers
    with capture_log() as lines:
        model = lib.llama_model_load_from_file(str(path).encode(), params)
    if model:
        _buffers[model] = parse_buffer_sizes(lines)
    if not model:
        raise EngineFailure(f"llama.cpp could not load {path} (see the kinfer.llama_cpp log)")
    return model


def meta_string(model: int, key: str) -> str | None:
    """A GGUF metadata value as text, or None when the key is absent."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", errors="replace")
        size = n + 1


def model_facts(model: int) -> ModelFacts:
    arch = meta_string(model, "general.architecture") or "unknown"
    template = lib.llama_model_chat_template(model, None)
    n_layer = int(lib.llama_model_n_layer(model))
    n_head = max(1, int(lib.llama_model_n_head(model)))
    n_head_kv = int(lib.llama_model_n_head_kv(model))
    head_dim = int(lib.llama_model_n_embd(model)) // n_head
    key_dim = _meta_int(model, f"{arch}.attention.key_length") or head_dim
    value_dim = _meta_int(model, f"{arch}.attention.value_length") or head_dim
    return ModelFacts(
        architecture=arch,
        chat_template=template.decode("utf-8", errors="replace") if template else None,
        train_context=int(lib.llama_model_n_ctx_train(model)),
        n_layer=n_layer,
        kv_bytes_per_token=n_layer * n_head_kv * (key_dim + value_dim) * BYTES_PER_KV_VALUE,
        recurrent=bool(lib.llama_model_is_recurrent(model)),
        hybrid=bool(lib.llama_model_is_hybrid(model)),
        model_bytes=int(lib.llama_model_size(model)),
    )


def model_embedding_length(model: int) -> int:
    """Width of the model's output states (what an embedding of it holds)."""
    n_out = getattr(lib, "llama_model_n_embd_out", None)
    return int(n_out(model) if n_out else lib.llama_model_n_embd(model))


def _meta_int(model: int, key: str) -> int | None:
    value = meta_string(model, key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class Vocab:
    """The model's vocabulary: text <-> token ids, and token pieces as bytes for streaming."""

    def __init__(self, model: int) -> None:
        self._vocab = lib.llama_model_get_vocab(model)
        self.n_tokens = int(lib.llama_vocab_n_tokens(self._vocab))
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(lib.llama_vocab_bos(self._vocab))
        self.eos = int(lib.llama_vocab_eos(self._vocab))
        self.bos_text = self._text(self.bos)
        self.eos_text = self._text(self.eos)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    def _text(self, token: int) -> str:
        if token < 0:
            return ""
        raw = lib.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def tokenize(self, text: str) -> list[int]:
        """Special tokens parsed; BOS prepended only if the model asks for it and the text lacks it."""
        data = text.encode("utf-8")
        capacity = len(data) + 2
        tokens = (lib.llama_token * capacity)()
        n = lib.llama_tokenize(self._vocab, data, len(data), tokens, capacity, False, True)
        if n < 0:  # cannot happen with one token per byte, but the API allows it
            capacity = -n
            tokens = (lib.llama_token * capacity)()
            n = lib.llama_tokenize(self._vocab, data, len(data), tokens, capacity, False, True)
        ids = list(tokens[:n])
        if self.add_bos and self.bos >= 0 and not (self.bos_text and text.startswith(self.bos_text)):
            ids.insert(0, self.bos)
        return ids

    def detokenize(self, tokens: list[int]) -> str:
        """Text of the tokens, special tokens rendered (the inverse of `tokenize`)."""
        if not tokens:
            return ""
        arr = (lib.llama_token * len(tokens))(*tokens)
        size = len(tokens) * 8 + 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = lib.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n + 1

    def piece(self, token: int) -> bytes:
        """The bytes one generated token adds to the reply (control tokens add none)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        n = lib.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, False)
        if n < 0:
            self._piece_buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self._vocab, token, self._piece_buf, -n, 0, False)
        piece = self._piece_buf.raw[:n]
        self._pieces[token] = piece
        return piece

    def is_eog(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_eog(self._vocab, token))

    def eog_tokens(self) -> list[int]:
        """Every token that ends a generation (EOS, EOT, <|im_end|>, ...)."""
        return [t for t in range(self.n_tokens) if lib.llama_vocab_is_eog(self._vocab, t)]

    def grammar_pieces(self) -> list[bytes]:
        """Each token's bytes as a grammar engine reads them: control tokens (which never spell text)
        as b"\\xff" + their name, every other token as the bytes it adds to the text."""
        buf = ctypes.create_string_buffer(1024)
        pieces = []
        for token in range(self.n_tokens):
            n = lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            piece = buf.raw[:n]
            if lib.llama_vocab_get_attr(self._vocab, token) & lib.LLAMA_TOKEN_ATTR_CONTROL:
                piece = b"\xff" + piece
            pieces.append(piece)
        return pieces

    @property
    def pointer(self) -> int:
        """The llama_vocab pointer (for llguidance's tokenizer, which calls llama_tokenize itself)."""
        return self._vocab


class TokenBatch:
    """One reusable `llama_batch`: each token belongs to one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._batch = lib.llama_batch_init(capacity, 0, 1)
        self.n = 0

    @property
    def raw(self) -> lib.llama_batch:
        self._batch.n_tokens = self.n
        return self._batch

    def clear(self) -> None:
        self.n = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token; returns its index (the index its logits are read at)."""
        i = self.n
        b = self._batch
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = 1 if logits else 0
        self.n = i + 1
        return i

    def free(self) -> None:
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None


def row_logits(ctx: int, index: int, n_vocab: int) -> np.ndarray:
    """The logits at batch index `index` as a writable numpy view of llama.cpp's own buffer: what is
    written here is what the sampler reads next (`sampler_sample` reads the same buffer)."""
    pointer = lib.llama_get_logits_ith(ctx, index)
    if not pointer:
        raise EngineFailure(f"llama.cpp has no logits at batch index {index}")
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,))


def tokenize_function() -> int:
    """The address of llama_tokenize in libllama (llguidance tokenizes through it)."""
    return int(ctypes.cast(lib.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value or 0)


# ---- per-sequence memory (KV cells, or recurrent states) --------------------------------------


def seq_clear(mem: int, seq: int) -> None:
    """Drop every cell of the sequence (removing a whole sequence never fails)."""
    lib.llama_memory_seq_rm(mem, seq, -1, -1)


def seq_trim(mem: int, seq: int, keep: int) -> bool:
    """Keep only positions [0, keep). False if the memory cannot cut a sequence (recurrent state)."""
    return bool(lib.llama_memory_seq_rm(mem, seq, keep, -1))


def seq_copy(mem: int, src: int, dst: int) -> None:
    """Make `dst` a copy of `src`. Across KV streams only whole copies exist: the cells' metadata
    changes now, the buffer copy runs at the start of the next decode, in call order."""
    lib.llama_memory_seq_cp(mem, src, dst, -1, -1)


def seq_length(mem: int, seq: int) -> int:
    """Tokens held for the sequence (its largest position + 1)."""
    return int(lib.llama_memory_seq_pos_max(mem, seq)) + 1


# ---- the context ------------------------------------------------------------------------------


def flash_attn_type(flash_attn: bool | None, gpu: bool) -> int:
    """llama.cpp's flash attention mode for the --flash-attn setting (None: auto, see create_context)."""
    if flash_attn is None:
        return lib.LLAMA_FLASH_ATTN_TYPE_AUTO if gpu else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED


def create_context(
    model: int,
    *,
    n_ctx: int,
    n_seq: int,
    n_batch: int,
    n_ubatch: int,
    threads: int,
    gpu: bool,
    flash_attn: bool | None = None,
) -> int:
    """A context with `n_seq` sequence ids, each owning its own KV stream of n_ctx / n_seq cells.

    kv_unified stays off: with one shared buffer every row's attention runs over all rows' cells,
    which costs more and makes a row's numbers depend on its neighbours (a batched row then no
    longer reproduces its solo run exactly; measured on SmolLM2).
    Flash attention (`flash_attn` None: auto) is left to llama.cpp on a GPU. On the CPU auto turns it
    on only where the loaded ggml is kinfer's batch-invariant build (invariant_attention.py): upstream's
    CPU kernel takes one of three paths by the pass's shape (a single row's decode over >= 512 cells
    is split across the threads, a chunk of >= the kernel's query tile is tiled, anything else goes
    row by row), each rounding differently, so a prompt adopted from the prefix pool or prefilled
    beside other rows would not reproduce its cold run, nor a batched reply its solo one (measured:
    logits off by up to 1.4; the plain path matched exactly). True turns it on anyway (faster, see
    docs/benchmarks.md "CPU parity").
    """
    params = lib.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_seq_max = n_seq
    params.n_batch = n_batch
    params.n_ubatch = n_ubatch
    # llama.cpp's default is half the cores; the engine thread owns the model, so use them all
    params.n_threads = threads
    params.n_threads_batch = threads
    params.kv_unified = False
    if flash_attn is None and not gpu and batch_invariant_cpu_flash_attention():
        flash_attn = True  # the same numbers whatever the batch: as exact as off, and faster
    params.flash_attn_type = flash_attn_type(flash_attn, gpu)
    params.no_perf = True
    with capture_log() as lines:
        ctx = lib.llama_init_from_model(model, params)
    if not ctx:
        raise EngineFailure(f"llama.cpp could not create a context of {n_ctx} tokens x {n_seq} sequences")
    _buffers[ctx] = parse_buffer_sizes(lines)
    _flash_attention[ctx] = any(_FLASH_ON.search(line) for line in lines)
    return ctx


def flash_attention(ctx: int) -> bool:
    """Whether llama.cpp said it runs this context's attention with flash attention (made here)."""
    return _flash_attention.get(ctx, False)


def context_memory(ctx: int) -> int:
    return lib.llama_get_memory(ctx)


def context_seq_length(ctx: int) -> int:
    """Cells per sequence, after llama.cpp's padding."""
    return int(lib.llama_n_ctx_seq(ctx))


def decode(ctx: int, batch: TokenBatch) -> int:
    """Run one forward pass; 0 on success (see llama_decode for the other codes)."""
    return int(lib.llama_decode(ctx, batch.raw))


def set_threads(ctx: int, threads: int) -> None:
    """Threads the context's next passes run on (prompt and generation alike)."""
    lib.llama_set_n_threads(ctx, threads, threads)


def free_context(ctx: int) -> None:
    _buffers.pop(ctx, None)
    _flash_attention.pop(ctx, None)
    lib.llama_free(ctx)


def free_model(model: int) -> None:
    _buffers.pop(model, None)
    lib.llama_model_free(model)
