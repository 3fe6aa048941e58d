"""The live batch: one row per reply being generated; finished rows stay dimmed a moment, then go.

Drawn line by line from cached strips rather than with a DataTable: under a 64-stream burst every
row changes on every tick, and a DataTable re-renders each cell through Rich (tens of milliseconds
a tick on a small machine, taken from the engine thread's share of the GIL). Here a tick formats
each changed row once, and drawing a line is handing back its strip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kinfer.scheduler import RequestSnapshot
from kinfer.tui import format as fmt
from kinfer.tui.sample import DashboardSample

FADE_SECONDS = 3.0
MAX_ROWS = 128  # a queue of hundreds would only cost time; the gauges count them all
ID_PREFIX = re.compile(r"^[A-Za-z]+[-_]")
GAP = "  "
# the narrow, always-useful columns first, so an 80-column terminal still shows the state of each row;
# the last column (the reply's tail) takes whatever width is left
COLUMNS = (  # key, label, width
    ("id", "REQUEST", 14),
    ("dialect", "DIALECT", 9),
    ("state", "STATE", 16),
    ("tokens", "TOKENS", 6),
    ("rate", "TOK/S", 5),
    ("age", "AGE", 6),
    ("model", "MODEL", 16),
    ("tail", "TEXT", 0),
)
RIGHT_ALIGNED = {"tokens", "rate", "age"}
TAIL_CHARS = 200  # more than any terminal line has room for

STYLES = {
    name: Style.parse(spec)
    for name, spec in {
        "": "none",
        "header": "bold",
        "dim": "dim",
        "failed": "dim red",
        "queued": "yellow",
        "prefill": "cyan",
        "decoding": "green",
        "embedding": "magenta",
    }.items()
}


@dataclass(frozen=True)
class BatchRow:
    """One row's text per column and its styles; compared between ticks to redraw only what changed."""

    key: str
    cells: tuple[str, ...]
    style: str  # "", "dim" (finished, fading) or "failed"
    state_style: str


def short_id(request_id: str, width: int = 14) -> str:
    """Keep the dialect's prefix and the end: `chatcmpl-…9f3a2c`, `msg_…4be1a07c`."""
    if len(request_id) <= width:
        return request_id
    match = ID_PREFIX.match(request_id)
    prefix = match.group(0) if match and len(match.group(0)) <= width - 5 else ""
    return f"{prefix}…{request_id[-(width - len(prefix) - 1) :]}"


def state_label(request: RequestSnapshot) -> str:
    """What the row is doing; a request for n replies says so (one row, n rows of the engine's batch)."""
    if request.finish is not None:
        failed = request.state == "failed" or request.finish == "error"
        return "failed" if failed else f"done ({request.finish})"
    if request.state == "prefill":
        label = f"prefill {request.prompt_processed}/{request.prompt_tokens}"
    else:
        label = request.state
    return f"{label} x{request.choices}" if request.choices > 1 else label


def make_row(request: RequestSnapshot, key: str, *, fading: bool) -> BatchRow:
    failed = request.finish == "error" or request.state == "failed"
    cells = (
        short_id(request.request_id),
        request.dialect,
        state_label(request),
        str(request.generated),
        fmt.rate(request.tokens_per_second) if request.generated > 1 else "-",
        fmt.seconds(request.age),
        request.model,
        " ".join(request.tail.split())[-TAIL_CHARS:],  # the end of the reply, on one line
    )
    style = "failed" if failed else "dim" if fading else ""
    return BatchRow(key, cells, style, "" if fading or failed else request.state)


def fit(text: str, width: int, *, right: bool = False) -> str:
    """Exactly `width` cells: padded, or cut with an ellipsis."""
    if cell_len(text) > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else text[:width]
    return text.rjust(width) if right else set_cell_size(text, width)


def tail_fit(text: str, width: int) -> str:
    """The last `width` cells: the newest words of a reply are the ones worth seeing."""
    if width <= 0:
        return ""
    return set_cell_size(text[-width:], width)


class BatchTable(ScrollView, can_focus=False):
    """A header line and one line per request; scrolls when there are more rows than lines."""

    DEFAULT_CSS = """
    BatchTable {
        height: 1fr;
        overflow-x: hidden;
    }
    """

    def __init__(self, *, fade_seconds: float = FADE_SECONDS, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fade_seconds = fade_seconds
        self.shown: dict[str, RequestSnapshot] = {}  # row key -> the request it shows (read by tests)
        self.fading: set[str] = set()  # row keys of finished requests still on screen, dimmed
        self.rows: list[BatchRow] = []
        self._strips: dict[tuple[BatchRow, int], Strip] = {}
        self._finished_seen: dict[str, float] = {}  # row key -> sample time it was first seen finished

    def visible_requests(self, sample: DashboardSample) -> list[tuple[str, RequestSnapshot, bool]]:
        """(row key, request, fading) in display order: live rows first, then the fading ones."""
        now = sample.taken_at
        live: list[tuple[str, RequestSnapshot, bool]] = []
        fading: list[tuple[str, RequestSnapshot, bool]] = []
        keys: set[str] = set()
        for request in sample.scheduler.requests:
            key = request.request_id
            while key in keys:  # a client may reuse an id; rows still need their own keys
                key += "'"
            keys.add(key)
            if request.finish is None:
                live.append((key, request, False))
                continue
            seen = self._finished_seen.setdefault(key, now)
            if now - seen < self.fade_seconds:
                fading.append((key, request, True))
        self._finished_seen = {k: t for k, t in self._finished_seen.items() if k in keys}
        return (live + fading)[:MAX_ROWS]

    def show(self, sample: DashboardSample) -> None:
        visible = self.visible_requests(sample)
        self.shown = {key: request for key, request, _ in visible}
        self.fading = {key for key, _, fading in visible if fading}
        rows = [make_row(request, key, fading=fading) for key, request, fading in visible]
        if rows == self.rows:
            return
        self.rows = rows
        width = self.scrollable_content_region.width
        # keep the strips of rows that did not change; forget the rest
        current = set(rows)
        self._strips = {k: v for k, v in self._strips.items() if k[1] == width and k[0] in current}
        self.virtual_size = Size(width, len(rows) + 1)
        self.border_subtitle = f"{len(rows) - len(self.fading)} live"
        self.refresh()

    def on_resize(self) -> None:
        self._strips.clear()
        self.virtual_size = Size(self.scrollable_content_region.width, len(self.rows) + 1)

    # ---- drawing -----------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:  # the header stays put while the rows scroll under it
            return self._strip(None, width).apply_style(base)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, base)
        row = self.rows[index]
        strip = self._strips.get((row, width))
        if strip is None:
            strip = self._strips[(row, width)] = self._strip(row, width)
        return strip.apply_style(base)

    def _strip(self, row: BatchRow | None, width: int) -> Strip:
        fixed = sum(w for _, _, w in COLUMNS[:-1]) + len(GAP) * (len(COLUMNS) - 1)
        tail_width = max(0, width - fixed - 1)
        segments: list[Segment] = [Segment(" ")]
        row_style = STYLES["header"] if row is None else STYLES[row.style]
        for index, (key, label, column_width) in enumerate(COLUMNS):
            if index:
                segments.append(Segment(GAP))
            if row is None:
                right = key in RIGHT_ALIGNED
                text = fit(label, column_width, right=right) if column_width else fit(label, tail_width)
                segments.append(Segment(text, row_style))
                continue
            value = row.cells[index]
            text = (
                tail_fit(value, tail_width)
                if not column_width
                else fit(value, column_width, right=key in RIGHT_ALIGNED)
            )
            style = row_style
            if key == "state" and row.state_style in STYLES:
                style = row_style + STYLES[row.state_style]
            segments.append(Segment(text, style))
        return Strip(segments).crop_extend(0, width, None)
