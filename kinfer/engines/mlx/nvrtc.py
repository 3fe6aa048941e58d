"""Compiling a CUDA source to a loadable binary with NVRTC, through ctypes.

MLX's CUDA build links libnvrtc itself (its wheel depends on nvidia-cuda-nvrtc; libmlx's RPATH points
at site-packages/nvidia/{cu13,cuda_nvrtc}/lib), so once `mlx.core` is imported on CUDA the library is
already mapped into the process: it is found there first, then beside MLX's package, then by the
loader's usual search. No cuda-python needed.

The target is the device's own compute capability: a cubin (`sm_XY`) where this NVRTC can build one,
else PTX (`compute_XY`) that the driver finishes at load, as MLX's own JIT does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so")


class NvrtcError(RuntimeError):
    """NVRTC is missing or refused the source."""


@dataclass(frozen=True)
class Binary:
    """A compiled kernel module: `data` is what precompiled_cuda_kernel takes as compiled_source."""

    data: bytes
    kind: str  # "cubin" or "ptx"
    arch: str  # the --gpu-architecture it was built for


def _candidates() -> list[str]:
    paths: list[str] = []
    try:  # already mapped by libmlx (the same handle ctypes would get)
        for line in Path("/proc/self/maps").read_text().splitlines():
            where = line.split()[-1] if line.split() else ""
            if "/libnvrtc.so" in where and where not in paths:
                paths.append(where)
    except OSError:
        pass
    try:
        import mlx

        site = Path(next(iter(mlx.__path__))).parent
        for sub in ("cu13", "cuda_nvrtc"):
            paths += sorted(str(p) for p in (site / "nvidia" / sub / "lib").glob("libnvrtc.so*"))
    except (ImportError, StopIteration):
        pass
    found = ctypes.util.find_library("nvrtc")
    return [*paths, *([found] if found else []), *_SONAMES]


@functools.cache
def library() -> ctypes.CDLL:
    """libnvrtc, loaded once; NvrtcError when there is none."""
    errors = []
    for candidate in _candidates():
        if "builtins" in candidate or ".alt." in candidate:
            continue
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as exc:
            errors.append(str(exc))
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        log.debug("NVRTC from %s", candidate)
        return lib
    raise NvrtcError("libnvrtc not found (" + "; ".join(errors[-2:]) + ")")


def version() -> tuple[int, int]:
    lib = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        message = lib.nvrtcGetErrorString(result)
        raise NvrtcError(f"{what}: {message.decode() if message else result}")


def compile_source(source: str, name: str, capability: tuple[int, int], *, cubin: bool = True) -> Binary:
    """Compile `source` (one translation unit, no includes) for a device of `capability` (major,
    minor). A cubin when asked and this NVRTC knows the architecture (sm_90a-style from 9.0 on, as
    MLX's own JIT builds), else PTX for the driver to finish."""
    major, minor = capability
    if cubin:
        for arch in [f"sm_{major}{minor}a"] * (major >= 9) + [f"sm_{major}{minor}"]:
            try:
                return _compile(source, name, arch, cubin=True)
            except NvrtcError as exc:
                if "INVALID_OPTION" not in str(exc) and "architecture" not in str(exc):
                    raise
                log.info("NVRTC cannot build a cubin for %s: %s", arch, exc)
    return _compile(source, name, f"compute_{major}{minor}", cubin=False)


def _compile(source: str, name: str, arch: str, *, cubin: bool) -> Binary:
    lib = library()
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        # the options MLX's JIT compiles custom kernels with (jit_module.cpp), so both paths agree
        options = [f"--gpu-architecture={arch}".encode(), b"--device-as-default-execution-space"]
        argv = (ctypes.c_char_p * len(options))(*options)
        result = lib.nvrtcCompileProgram(prog, len(options), argv)
        if result != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, text)
            message = lib.nvrtcGetErrorString(result).decode()
            raise NvrtcError(f"--gpu-architecture={arch}: {message}: {text.value.decode(errors='replace')}")
        get_size, get = (
            (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
        )
        size = ctypes.c_size_t()
        _check(lib, get_size(prog, ctypes.byref(size)), "size")
        data = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, data), "get")
        return Binary(data.raw, "cubin" if cubin else "ptx", arch)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def device_capability() -> tuple[int, int]:
    """The default CUDA device's compute capability, from MLX's device info (its cudaDeviceProp)."""
    import mlx.core as mx

    info = mx.device_info(mx.default_device())
    major, minor = info.get("compute_capability_major"), info.get("compute_capability_minor")
    if not isinstance(major, int) or not isinstance(minor, int):
        raise NvrtcError(f"MLX reports no compute capability for {mx.default_device()}")
    return major, minor
