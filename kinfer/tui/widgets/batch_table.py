"""The live batch: one row per reply being generated; finished rows stay dimmed a moment, then go."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

from kinfer.scheduler import RequestSnapshot
from kinfer.tui import format as fmt
from kinfer.tui.sample import DashboardSample

FADE_SECONDS = 3.0
MAX_ROWS = 128  # a queue of hundreds would only cost render time; the gauges count them all
# the narrow, always-useful columns first, so an 80-column terminal still shows the state of each row
COLUMNS = (  # key, label, width
    ("id", "REQUEST", 14),
    ("dialect", "DIALECT", 9),
    ("state", "STATE", 16),
    ("tokens", "TOKENS", 6),
    ("rate", "TOK/S", 5),
    ("age", "AGE", 6),
    ("model", "MODEL", 16),
    ("tail", "TEXT", 60),
)


@dataclass(frozen=True)
class BatchRow:
    """What one row shows, already formatted (compared between ticks to update only what changed)."""

    key: str
    cells: tuple[tuple[str, str], ...]  # (text, style) per column

    def texts(self) -> tuple[Text, ...]:
        return tuple(Text(value, style=style, no_wrap=True, overflow="ellipsis") for value, style in self.cells)


def short_id(request_id: str, width: int = 14) -> str:
    """Keep the dialect prefix and the end: `chatcmpl-…9f3a2c`."""
    if len(request_id) <= width:
        return request_id
    prefix, _, rest = request_id.rpartition("-")
    if prefix and len(prefix) < width - 5:
        return f"{prefix}-…{rest[-(width - len(prefix) - 2):]}"
    return "…" + request_id[-(width - 1) :]


def state_label(request: RequestSnapshot) -> str:
    if request.finish is not None:
        return "failed" if request.state == "failed" or request.finish == "error" else f"done ({request.finish})"
    if request.state == "prefill":
        return f"prefill {request.prompt_processed}/{request.prompt_tokens}"
    return request.state


def tail_text(tail: str, width: int) -> str:
    """The end of the reply on one line."""
    flat = " ".join(tail.split())
    return flat[-width:]


def make_row(request: RequestSnapshot, key: str, *, fading: bool) -> BatchRow:
    style = "dim" if fading else ""
    if request.finish == "error" or request.state == "failed":
        style = "dim red"
    state_style = {"queued": "yellow", "prefill": "cyan", "decoding": "green"}.get(request.state, "")
    values = (
        (short_id(request.request_id), ""),
        (request.dialect, ""),
        (state_label(request), "" if fading else state_style),
        (str(request.generated), ""),
        (fmt.rate(request.tokens_per_second) if request.generated > 1 else "-", ""),
        (fmt.seconds(request.age), ""),
        (request.model, ""),
        (tail_text(request.tail, COLUMNS[-1][2]), ""),
    )
    cells = tuple((value, " ".join(s for s in (style, cell_style) if s)) for value, cell_style in values)
    return BatchRow(key, cells)


class BatchTable(DataTable):
    """Rebuilt only when rows come or go; otherwise only the changed cells are updated."""

    DEFAULT_CSS = """
    BatchTable {
        height: 1fr;
        overflow-x: hidden;
    }
    """

    def __init__(self, *, fade_seconds: float = FADE_SECONDS, **kwargs) -> None:
        super().__init__(cursor_type="none", zebra_stripes=False, show_cursor=False, **kwargs)
        self.can_focus = False
        self.fade_seconds = fade_seconds
        self.shown: dict[str, RequestSnapshot] = {}  # row key -> the request it shows (read by tests)
        self._rows: dict[str, BatchRow] = {}
        self._finished_seen: dict[str, float] = {}  # row key -> sample time it was first seen finished

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, width=width, key=key)

    def visible_requests(self, sample: DashboardSample) -> list[tuple[str, RequestSnapshot, bool]]:
        """(row key, request, fading) in display order: live rows first, then the fading ones."""
        now = sample.taken_at
        rows: list[tuple[str, RequestSnapshot, bool]] = []
        keys: set[str] = set()
        for request in sample.scheduler.requests:
            key = request.request_id
            while key in keys:  # a client may reuse an id; rows still need unique keys
                key += "'"
            keys.add(key)
            if request.finish is None:
                rows.append((key, request, False))
                continue
            seen = self._finished_seen.setdefault(key, now)
            if now - seen < self.fade_seconds:
                rows.append((key, request, True))
        self._finished_seen = {k: t for k, t in self._finished_seen.items() if k in keys}
        live = [r for r in rows if not r[2]]
        fading = [r for r in rows if r[2]]
        return (live + fading)[:MAX_ROWS]

    def show(self, sample: DashboardSample) -> None:
        visible = self.visible_requests(sample)
        rows = [make_row(request, key, fading=fading) for key, request, fading in visible]
        self.shown = {key: request for key, request, _ in visible}
        if [r.key for r in rows] != list(self._rows):
            self.clear()
            for row in rows:
                self.add_row(*row.texts(), key=row.key)
        else:
            for row in rows:
                old = self._rows[row.key]
                if row == old:
                    continue
                for (column, _, _), cell, text, before in zip(
                    COLUMNS, row.cells, row.texts(), old.cells, strict=True
                ):
                    if cell != before:
                        self.update_cell(row.key, column, text)
        self._rows = {row.key: row for row in rows}
        self.border_subtitle = f"{sum(1 for _, _, f in visible if not f)} live"
