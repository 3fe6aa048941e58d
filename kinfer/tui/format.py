"""Short human forms of numbers for narrow columns."""

from __future__ import annotations

import time

from kinfer.store.progress import format_bytes, format_duration

__all__ = ["clock", "format_bytes", "format_duration", "rate", "seconds", "size", "tokens"]


def size(n: float) -> str:
    """Bytes in at most ~9 characters: '98 MiB', '1.2 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.1f} {unit}" if abs(n) < 10 else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"  # pragma: no cover


def rate(tokens_per_second: float) -> str:
    """'0', '8.5', '123', '12.3k'."""
    if tokens_per_second <= 0:
        return "0"
    if tokens_per_second < 10:
        return f"{tokens_per_second:.1f}"
    if tokens_per_second < 10_000:
        return f"{tokens_per_second:.0f}"
    return f"{tokens_per_second / 1000:.1f}k"


def tokens(n: int) -> str:
    """'950', '12.3k', '4.1M'."""
    if n < 10_000:
        return str(n)
    if n < 10_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def seconds(s: float) -> str:
    """'0.4s', '12s', '3m05s', '1h02m'."""
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        minutes, secs = divmod(int(s), 60)
        return f"{minutes}m{secs:02d}s"
    hours, rest = divmod(int(s), 3600)
    return f"{hours}h{rest // 60:02d}m"


def clock(unix_time: float) -> str:
    """Local wall-clock time, HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(unix_time))
