"""Custom CUDA kernels compiled once per instantiation and launched precompiled.

`mx.fast.cuda_kernel`'s call writes the kernel's whole source text again on every call (MLX's
`build_kernel`), which cost ~2 ms of host time a step for 113 calls on the H200. Here each
instantiation (a kernel's template arguments and input dtypes) is compiled once with NVRTC
(nvrtc.py) and every later call hands MLX the finished binary (`mx.fast.precompiled_cuda_kernel`).

Opt-in (`mlx_precompiled_kernels`, off by default): on the H200 the JIT call turned out cheap (~5 us of
Python per call) and a precompiled call costs about as much or a little more, since MLX copies and
hashes the 7-27 KB binary on every call (scripts/check_cuda_kernels.py; docs/benchmarks.md).

Guarded: an instantiation is used only after it compiled and a self-check on synthetic inputs gave the
JIT kernel's output (within a dtype's rounding). Any failure turns the precompiled path off for that
kernel for the rest of the process, logged once with its reason; callers then take the JIT path, as
before this module existed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

import mlx.core as mx

from kinfer.engines.mlx import nvrtc

log = logging.getLogger(__name__)

# a self-check: given the compiled binary and its symbol, the reason its output differs from the JIT
# kernel's on the same inputs, or None when they agree
SelfCheck = Callable[[bytes, str], "str | None"]


class PrecompiledKernel:
    """One kernel body's precompiled instantiations: `binary(key, ...)` is the compiled module for
    `key` (bytes and symbol name), or None when the JIT path must serve it."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.disabled: str | None = None  # the reason, once the path is off for the process
        self._ready: dict[Hashable, tuple[bytes, str]] = {}
        self._lock = threading.Lock()

    def binary(
        self, key: Hashable, name: str, source: Callable[[], str], check: SelfCheck
    ) -> tuple[bytes, str] | None:
        """The checked binary for `key`, compiling `source()` as symbol `name` and running `check` on
        first use. None (for good, after a failure) when it cannot be used."""
        ready = self._ready.get(key)
        if ready is not None or self.disabled is not None:
            return ready
        with self._lock:
            if key in self._ready or self.disabled is not None:
                return self._ready.get(key)
            try:
                built = nvrtc.compile_source(source(), name, nvrtc.device_capability())
            except Exception as exc:  # NVRTC missing, the source refused, no device info
                return self._disable(f"compiling {name} failed: {exc}")
            try:
                reason = check(built.data, name)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                return self._disable(f"{name} disagrees with the JIT kernel: {reason}")
            log.info(
                "%s: %s compiled for %s (%s, %d bytes)",
                self.label,
                name,
                built.arch,
                built.kind,
                len(built.data),
            )
            self._ready[key] = (built.data, name)
            return self._ready[key]

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        log.warning(
            "%s: precompiled kernels off for this process, the JIT kernel serves: %s", self.label, reason
        )
        return None


def outputs_agree(got: list[mx.array], want: list[mx.array]) -> str | None:
    """None when every output matches the reference within its dtype's rounding, else what differs."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        a32, b32 = a.astype(mx.float32), b.astype(mx.float32)
        rtol, atol = TOLERANCE.get(a.dtype, (1e-5, 1e-5))
        if not mx.allclose(a32, b32, rtol=rtol, atol=atol, equal_nan=True).item():
            worst = mx.max(mx.abs(a32 - b32)).item()
            return f"output {i} ({a.dtype}): max |difference| {worst:.3g}"
    return None


# (rtol, atol): one unit in the last place of the output dtype, for a sum computed in another order
TOLERANCE = {mx.bfloat16: (1e-2, 1e-3), mx.float16: (1e-3, 1e-3), mx.float32: (1e-5, 1e-5)}
