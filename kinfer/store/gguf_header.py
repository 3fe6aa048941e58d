"""A fast reader for a GGUF file's header: metadata and tensor infos, never the tensors themselves.

`gguf.GGUFReader` takes seconds on a real model because it turns every vocabulary entry into a numpy
array. Here long arrays (the 49k-token vocab, the merges) are stepped over and kept only as an
`ArraySummary`, so a header reads in milliseconds. The same parser works on a file (memory-mapped, so
the tensor data is never paged in) and on a bytes prefix, e.g. the first megabytes of a remote GGUF
fetched with a ranged request; a prefix that stops too early raises `NeedMoreBytes`.

Layout (GGUF v2/v3): magic "GGUF", u32 version, u64 tensor count, u64 key/value count, the key/value
pairs, then one info per tensor (name, u32 n_dims, u64 dims..., u32 ggml type, u64 data offset).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
# arrays longer than this are summarised, not decoded; per-layer arrays (head counts) stay well below
MAX_ARRAY_ITEMS = 1024
# a single string or array this large means a corrupt header, not a real model
_MAX_STRING_BYTES = 1 << 30
_MAX_ARRAY_LENGTH = 1 << 34
_MAX_TENSORS = 1 << 24
_MAX_DIMS = 8

# GGUF value types: id -> (name, struct code or None for string/array)
_VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("uint8", "B"),
    1: ("int8", "b"),
    2: ("uint16", "H"),
    3: ("int16", "h"),
    4: ("uint32", "I"),
    5: ("int32", "i"),
    6: ("float32", "f"),
    7: ("bool", "?"),
    8: ("string", None),
    9: ("array", None),
    10: ("uint64", "Q"),
    11: ("int64", "q"),
    12: ("float64", "d"),
}
_STRING, _ARRAY = 8, 9

# ggml tensor types (ggml.h `enum ggml_type`); ids 4, 5 and 31-33, 36-38 were retired upstream
GGML_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}  # fmt: skip

# llama.cpp's `enum llama_ftype` (general.file_type), named the way model cards name quantizations
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}  # fmt: skip


class NeedMoreBytes(Exception):
    """The bytes prefix ends before the header does; fetch at least `needed` bytes and try again.

    `needed` is a lower bound: the header may turn out longer once those bytes are in.
    """

    def __init__(self, needed: int) -> None:
        super().__init__(f"GGUF header continues past the bytes given: need at least {needed} bytes")
        self.needed = needed


class GGUFFormatError(ValueError):
    """The data is not a GGUF file this reader understands (bad magic, v1, corrupt lengths)."""


@dataclass(frozen=True)
class ArraySummary:
    """A metadata array too long to decode (a vocabulary, merges): its element type and length."""

    element_type: str
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's description in the header; the data itself is never read."""

    name: str
    shape: tuple[int, ...]  # ggml order (ne[]): innermost dimension first, the reverse of numpy's
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, f"type{self.ggml_type}")

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFHeader:
    """What the header says: metadata, tensor count and (when reachable) the tensor infos."""

    version: int
    tensor_count: int
    metadata: dict[str, Any] = field(repr=False)
    # None when reading a prefix that ends inside the tensor infos (and they were not required)
    tensors: tuple[TensorInfo, ...] | None = field(repr=False)
    kv_end: int
    tensor_info_end: int | None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    def arch_value(self, suffix: str) -> Any:
        """`<architecture>.<suffix>`, e.g. arch_value("context_length")."""
        return self.metadata.get(f"{self.architecture}.{suffix}") if self.architecture else None

    @property
    def context_length(self) -> int | None:
        value = self.arch_value("context_length")
        return value if isinstance(value, int) else None

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    @property
    def file_type(self) -> str | None:
        """general.file_type as a quantization name ("Q4_K_M"), if the file says."""
        value = self.metadata.get("general.file_type")
        if not isinstance(value, int):
            return None
        return FILE_TYPES.get(value & ~1024)  # 1024 marks a guessed file type

    @property
    def split_count(self) -> int:
        value = self.metadata.get("split.count")
        return value if isinstance(value, int) and value > 0 else 1

    @property
    def split_no(self) -> int:
        value = self.metadata.get("split.no")
        return value if isinstance(value, int) else 0

    @property
    def parameter_count(self) -> int | None:
        if self.tensors is None:
            return None
        return sum(t.n_elements for t in self.tensors)

    def elements_by_type(self) -> Counter[str]:
        """Total tensor elements per ggml type name (empty when the tensor infos were not reached)."""
        counts: Counter[str] = Counter()
        for tensor in self.tensors or ():
            counts[tensor.type_name] += tensor.n_elements
        return counts


class _Cursor:
    """Reads little- or big-endian values from a buffer, raising NeedMoreBytes past its end."""

    def __init__(self, buf: bytes | mmap.mmap, endian: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.endian = endian
        self._u32 = struct.Struct(endian + "I")
        self._u64 = struct.Struct(endian + "Q")

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise NeedMoreBytes(self.pos + n)

    def u32(self) -> int:
        self.need(4)
        (value,) = self._u32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self) -> int:
        self.need(8)
        (value,) = self._u64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def string(self) -> str:
        n = self.u64()
        if n > _MAX_STRING_BYTES:
            raise GGUFFormatError(f"string of {n} bytes at offset {self.pos - 8}: corrupt header")
        self.need(n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        # the hot loop for vocabularies: one length read per entry, nothing decoded
        unpack, buf, size, pos = self._u64.unpack_from, self.buf, self.size, self.pos
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise NeedMoreBytes(pos + 8)
            (n,) = unpack(buf, pos)
            pos += 8 + n
        if pos > size:
            self.pos = pos
            raise NeedMoreBytes(pos)
        self.pos = pos

    def scalar(self, code: str) -> Any:
        size = struct.calcsize(code)
        self.need(size)
        (value,) = struct.unpack_from(self.endian + code, self.buf, self.pos)
        self.pos += size
        return value

    def value(self, vtype: int, max_array: int) -> Any:
        if vtype not in _VALUE_TYPES:
            raise GGUFFormatError(f"unknown GGUF value type {vtype} at offset {self.pos}")
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(max_array)
        code = _VALUE_TYPES[vtype][1]
        assert code is not None
        return self.scalar(code)

    def array(self, max_array: int) -> list[Any] | ArraySummary:
        etype = self.u32()
        count = self.u64()
        if etype not in _VALUE_TYPES:
            raise GGUFFormatError(f"unknown GGUF array element type {etype} at offset {self.pos}")
        if count > _MAX_ARRAY_LENGTH:
            raise GGUFFormatError(f"array of {count} items at offset {self.pos}: corrupt header")
        name, code = _VALUE_TYPES[etype]
        if count > max_array:
            if code is not None:
                width = struct.calcsize(code) * count
                self.need(width)
                self.pos += width
            elif etype == _STRING:
                self.skip_strings(count)
            else:  # arrays of arrays: rare enough to walk one by one
                for _ in range(count):
                    self.array(0)
            return ArraySummary(name, count)
        if code is not None:
            width = struct.calcsize(code) * count
            self.need(width)
            values = list(struct.unpack_from(f"{self.endian}{count}{code}", self.buf, self.pos))
            self.pos += width
            return values
        return [self.value(etype, max_array) for _ in range(count)]


def parse_gguf_header(
    data: bytes | bytearray | memoryview | mmap.mmap,
    *,
    max_array: int = MAX_ARRAY_ITEMS,
    need_tensors: bool = False,
) -> GGUFHeader:
    """Parse a GGUF header from the start of `data` (a whole file or any prefix of one).

    Raises `NeedMoreBytes` when `data` ends inside the metadata, or inside the tensor infos when
    `need_tensors` is set; otherwise a prefix that ends inside the tensor infos gives `tensors=None`.
    """
    buf = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
    if len(buf) < 4:
        raise NeedMoreBytes(24)
    if buf[:4] != GGUF_MAGIC:
        raise GGUFFormatError(f"not a GGUF file (starts with {bytes(buf[:4])!r})")
    if len(buf) < 24:
        raise NeedMoreBytes(24)
    (version,) = struct.unpack_from("<I", buf, 4)
    endian = "<"
    if version > 0xFFFF:  # a big-endian file (s390x builds) has its version byte-swapped
        (version,) = struct.unpack_from(">I", buf, 4)
        endian = ">"
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} is not supported (only v2 and v3)")
    cur = _Cursor(buf, endian)
    cur.pos = 8
    tensor_count = cur.u64()
    kv_count = cur.u64()
    if tensor_count > _MAX_TENSORS or kv_count > _MAX_TENSORS:
        raise GGUFFormatError(f"implausible counts ({tensor_count} tensors, {kv_count} keys): corrupt header")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cur.string()
        metadata[key] = cur.value(cur.u32(), max_array)
    kv_end = cur.pos
    tensors: list[TensorInfo] | None = []
    try:
        for _ in range(tensor_count):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > _MAX_DIMS:
                raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions: corrupt header")
            # dims are stored innermost first, as ggml's ne[]
            shape = tuple(cur.u64() for _ in range(n_dims))
            ggml_type = cur.u32()
            offset = cur.u64()
            tensors.append(TensorInfo(name, shape, ggml_type, offset))
    except NeedMoreBytes:
        if need_tensors:
            raise
        tensors = None
    return GGUFHeader(
        version=version,
        tensor_count=tensor_count,
        metadata=metadata,
        tensors=None if tensors is None else tuple(tensors),
        kv_end=kv_end,
        tensor_info_end=None if tensors is None else cur.pos,
    )


def read_gguf_header(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    max_array: int = MAX_ARRAY_ITEMS,
    need_tensors: bool = False,
) -> GGUFHeader:
    """Read the header of a GGUF file (a path) or of a bytes prefix of one.

    A file is memory-mapped, so only the header's pages are read from disk, and its tensor infos are
    always read (`need_tensors` only matters for a prefix). A file that ends inside its header is a
    `GGUFFormatError` (it is truncated); a bytes prefix that does raises `NeedMoreBytes`.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return parse_gguf_header(source, max_array=max_array, need_tensors=need_tensors)
    path = Path(source)
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            head = fh.read()
            if head[:4] != GGUF_MAGIC:
                raise GGUFFormatError(f"{path}: not a GGUF file")
            raise GGUFFormatError(f"{path}: truncated GGUF file ({size} bytes)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                return parse_gguf_header(mapped, max_array=max_array, need_tensors=True)
            except NeedMoreBytes as exc:
                raise GGUFFormatError(
                    f"{path}: truncated GGUF file ({size} bytes, header needs {exc.needed}+)"
                ) from None
            except GGUFFormatError as exc:
                raise GGUFFormatError(f"{path}: {exc}") from None
