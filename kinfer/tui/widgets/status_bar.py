"""The top line: where the server listens, what is loaded, and the sample's clock."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from kinfer.tui import format as fmt
from kinfer.tui.sample import DashboardSample


class StatusBar(Static):
    """`kinfer  http://127.0.0.1:11500  smollm2:135m (4 rows)  2 active               12:00:03`."""

    DEFAULT_CSS = """
    StatusBar {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    def __init__(self, url: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.note = ""  # e.g. "stopping..." while the server shuts down

    def show(self, sample: DashboardSample) -> None:
        snap = sample.scheduler
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("kinfer", style="bold")
        if self.url:
            line.append("  " + self.url)
        if snap.models:
            for model in snap.models:
                line.append(f"  {model.name}", style="bold")
                line.append(f" ({model.rows_total} rows)")
        else:
            line.append("  no model loaded")
        active = sum(1 for r in snap.requests if r.finish is None)
        line.append(f"  {active} active")
        if self.note:
            line.append(f"  {self.note}", style="bold reverse")
        grid = Table.grid(expand=True)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(justify="right", no_wrap=True)
        grid.add_row(line, fmt.clock(snap.taken_at))
        self.update(grid, layout=False)  # one line, always: no layout pass needed
