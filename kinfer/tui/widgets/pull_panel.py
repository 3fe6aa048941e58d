"""A pull in progress: one bar for the model, bytes, rate and ETA, and a line per file."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from kinfer.store.progress import PullProgress
from kinfer.tui import format as fmt

RATE_WINDOW_S = 5.0
FILES_SHOWN = 3


class RateWindow:
    """Bytes per second over the last few seconds of (time, bytes) samples."""

    def __init__(self, window: float = RATE_WINDOW_S) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, completed: int) -> float:
        self.samples.append((at, completed))
        while len(self.samples) > 2 and at - self.samples[0][0] > self.window:
            self.samples.popleft()
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return max(0.0, (c1 - c0) / (t1 - t0)) if t1 > t0 else 0.0


@dataclass
class FileState:
    completed: int = 0
    total: int = 0
    rate: float = 0.0
    verifying: bool = False
    window: RateWindow = field(default_factory=RateWindow)

    @property
    def done(self) -> bool:
        return self.total > 0 and self.completed >= self.total and not self.verifying


def eta(left: int, rate: float) -> str:
    return fmt.format_duration(left / rate) if rate > 0 else "--:--"


class PullPanel(Vertical):
    """Hidden until a pull starts. Fed `PullProgress` events with the time each arrived."""

    DEFAULT_CSS = """
    PullPanel {
        height: auto;
        display: none;
        padding: 0 1;
    }
    PullPanel.-active {
        display: block;
    }
    PullPanel ProgressBar {
        width: 100%;
    }
    PullPanel ProgressBar Bar {
        width: 1fr;
    }
    PullPanel Static {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ref = ""
        self.phase = ""
        self.files: dict[str, FileState] = {}
        self.rate = 0.0
        self.last: PullProgress | None = None
        self._overall = RateWindow()

    def compose(self) -> ComposeResult:
        yield Static(id="pull-title")
        yield ProgressBar(total=None, show_eta=False, id="pull-bar")
        yield Static(id="pull-detail")
        yield Static(id="pull-files")

    def begin(self, ref: str) -> None:
        self.ref, self.phase, self.files, self.last, self.rate = ref, "resolving", {}, None, 0.0
        self._overall = RateWindow()
        self.add_class("-active")
        self.query_one("#pull-title", Static).update(Text.assemble(("pulling ", "bold"), ref))
        self.query_one("#pull-bar", ProgressBar).update(total=None, progress=0)
        self.query_one("#pull-detail", Static).update("pulling manifest")
        self.query_one("#pull-files", Static).update("")

    def apply(self, event: PullProgress, at: float) -> None:
        """Show one progress event (on the app's loop; `at` is its `time.monotonic()`)."""
        self.last, self.phase = event, event.phase
        if event.file is not None and event.phase in ("downloading", "verifying"):
            state = self.files.setdefault(event.file, FileState())
            state.completed, state.total = event.completed, event.total
            state.verifying = event.phase == "verifying"
            state.rate = state.window.add(at, event.completed)
        if event.overall_total:
            self.rate = self._overall.add(at, event.overall_completed)
            self.query_one("#pull-bar", ProgressBar).update(
                total=event.overall_total, progress=event.overall_completed
            )
        title = Text.assemble(("pulling ", "bold"), event.model or self.ref)
        self.query_one("#pull-title", Static).update(title)
        self.query_one("#pull-detail", Static).update(self._detail(event))
        self.query_one("#pull-files", Static).update(self._file_lines())

    def end(self, text: str, *, error: bool = False) -> None:
        """Leave the final word on screen (the app hides the panel a little later)."""
        self.phase = "error" if error else "done"
        style = "bold red" if error else "bold green"
        self.query_one("#pull-detail", Static).update(Text(text, style=style))
        if not error and self.last is not None and self.last.overall_total:
            total = self.last.overall_total
            self.query_one("#pull-bar", ProgressBar).update(total=total, progress=total)

    def hide(self) -> None:
        self.remove_class("-active")

    def _detail(self, event: PullProgress) -> Text:
        if event.phase not in ("downloading", "verifying") or not event.overall_total:
            return Text(event.status)
        left = event.overall_total - event.overall_completed
        return Text.assemble(
            (
                f"{fmt.format_bytes(event.overall_completed)} / {fmt.format_bytes(event.overall_total)}",
                "bold",
            ),
            f"  {fmt.format_bytes(self.rate)}/s  ETA {eta(left, self.rate)}",
            ("  verifying" if event.phase == "verifying" else "", "dim"),
        )

    def _file_lines(self) -> Text:
        """The newest few files; numbers first, so a narrow panel clips the file name, not the numbers."""
        lines = Text(no_wrap=True, overflow="ellipsis")
        shown = list(self.files.items())[-FILES_SHOWN:]
        for index, (name, state) in enumerate(shown):
            if index:
                lines.append("\n")
            if state.done:
                lines.append("✓ 100%  ", style="green")
                lines.append(f"{fmt.format_bytes(state.total)}  ", style="dim")
                lines.append(name)
                continue
            percent = state.completed / state.total if state.total else 0.0
            lines.append(f"↓ {percent:4.0%}  ", style="bold")
            lines.append(
                f"{fmt.format_bytes(state.completed)}/{fmt.format_bytes(state.total)}  ", style="dim"
            )
            if state.verifying:
                lines.append("verifying sha256  ", style="dim")
            else:
                left = state.total - state.completed
                lines.append(f"{fmt.format_bytes(state.rate)}/s  ETA {eta(left, state.rate)}  ", style="dim")
            lines.append(name)
        return lines
