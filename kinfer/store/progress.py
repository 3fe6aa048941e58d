"""Pull progress: the events `pull()` reports, and the terminal renderer `kinfer pull` uses.

One event type serves every watcher. The dashboard reads `overall_*` for one bar per download; Ollama's
`/api/pull` turns each event into an NDJSON line with `ollama_status()`:
    {"status": "pulling <digest12>", "digest": "sha256:...", "total": N, "completed": M}
    {"status": "verifying sha256 digest"}  {"status": "writing manifest"}  {"status": "success"}
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Literal, TextIO

Phase = Literal["resolving", "waiting", "downloading", "verifying", "installing", "success"]

# plain (non-TTY) output: one line per file per this many seconds, plus its first and last
PLAIN_INTERVAL_S = 5.0
# TTY redraws at most this often
TTY_INTERVAL_S = 0.1
_BAR_WIDTH = 24


@dataclass(frozen=True)
class PullProgress:
    """One step of a pull. Byte counts are for `file`; `overall_*` for the whole model."""

    status: str  # human text, Ollama's wording: "pulling 3f0a9c1e2b4d", "verifying sha256 digest", ...
    phase: Phase
    model: str | None = None  # the store name the pull will install
    file: str | None = None  # path inside the repo
    completed: int = 0
    total: int = 0
    digest: str | None = None  # "sha256:<hex>" for LFS files
    overall_completed: int = 0
    overall_total: int = 0
    resumed_from: int = 0  # bytes of `file` already on disk when this transfer started

    def ollama_status(self) -> dict[str, Any]:
        """The NDJSON object Ollama's `/api/pull` streams for this event."""
        if self.phase == "downloading" and self.digest:
            return {
                "status": self.status,
                "digest": self.digest,
                "total": self.total,
                "completed": self.completed,
            }
        if self.phase == "downloading":
            return {"status": self.status, "total": self.total, "completed": self.completed}
        return {"status": self.status}


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):  # NaN / unknown
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class _Rate:
    """Bytes per second over a sliding window of a few seconds (ETA from the recent rate)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.samples: list[tuple[float, int]] = []

    def add(self, now: float, completed: int) -> float:
        self.samples.append((now, completed))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.pop(0)
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


class ProgressPrinter:
    """Draws pull progress on stderr: a redrawn bar on a terminal, plain lines otherwise.

    Call it with each `PullProgress` (it is the `on_progress` callback of `pull()`).
    """

    def __init__(
        self, stream: TextIO | None = None, *, tty: bool | None = None, clock=time.monotonic
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self._file: str | None = None
        self._file_rate = _Rate()
        self._total_rate = _Rate()
        self._last_draw = 0.0
        self._last_status: str | None = None
        self._line_open = False

    def __call__(self, event: PullProgress) -> None:
        now = self.clock()
        if event.phase != "downloading":
            self._finish_line()
            if event.status != self._last_status:
                self._write(event.status + "\n")
            self._last_status = event.status
            return
        self._last_status = None
        new_file = event.file != self._file
        if new_file:
            self._finish_line()
            self._file = event.file
            self._file_rate = _Rate()
            if not self.tty:
                start = f" (resuming at {format_bytes(event.resumed_from)})" if event.resumed_from else ""
                self._write(f"pulling {event.file} {format_bytes(event.total)}{start}\n")
        file_rate = self._file_rate.add(now, event.completed)
        total_rate = self._total_rate.add(now, event.overall_completed)
        done = event.completed >= event.total
        interval = TTY_INTERVAL_S if self.tty else PLAIN_INTERVAL_S
        if not (new_file or done or now - self._last_draw >= interval):
            return
        self._last_draw = now
        line = self._line(event, file_rate, total_rate)
        if self.tty:
            self._write("\r\x1b[2K" + line)
            self._line_open = True
            if done:
                self._finish_line()
        elif not new_file or done:
            self._write(line + "\n")

    def _line(self, event: PullProgress, file_rate: float, total_rate: float) -> str:
        frac = event.completed / event.total if event.total else 1.0
        filled = int(frac * _BAR_WIDTH)
        bar = "█" * filled + "░" * (_BAR_WIDTH - filled)
        eta = (event.total - event.completed) / file_rate if file_rate > 0 else float("nan")
        name = event.file or ""
        if len(name) > 32:
            name = "…" + name[-31:]
        line = (
            f"{name} {bar} {frac * 100:5.1f}% {format_bytes(event.completed)}/{format_bytes(event.total)}"
            f" {format_bytes(file_rate)}/s ETA {format_duration(eta)}"
        )
        if event.overall_total and event.overall_total != event.total:
            left = event.overall_total - event.overall_completed
            total_eta = left / total_rate if total_rate > 0 else float("nan")
            line += (
                f" | total {format_bytes(event.overall_completed)}/{format_bytes(event.overall_total)}"
                f" ETA {format_duration(total_eta)}"
            )
        return line

    def _finish_line(self) -> None:
        if self._line_open:
            self._write("\n")
            self._line_open = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
