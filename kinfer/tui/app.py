"""The dashboard: the live batch, gauges, the request log and the model store, over a running server.

    run_dashboard(runtime, sock)    # what `kinfer` (no subcommand) runs; returns the exit status

The app reads one `DashboardSample` per tick (at most 4 a second, never per token) from a
`SampleSource`: `LiveSource` for a running scheduler, `RecordedSource` to replay one. It never owns
an engine; load, unload and delete go through the scheduler and the store like any client's would.

For a benchmark, `make_dashboard(runtime, sock)` builds the same app without running it:
`await app.run_async(headless=True, size=(120, 36))` serves and refreshes with no terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Footer

from kinfer.errors import KinferError
from kinfer.request_log import LOGGER_NAME as REQUEST_LOGGER
from kinfer.tui import format as fmt
from kinfer.tui.log_capture import QueueLogHandler, captured_logging
from kinfer.tui.rates import HISTORY, RateTracker
from kinfer.tui.sample import DashboardSample, SampleSource
from kinfer.tui.screens.confirm import ConfirmScreen
from kinfer.tui.screens.pull_dialog import PullScreen
from kinfer.tui.widgets.batch_table import FADE_SECONDS, BatchTable
from kinfer.tui.widgets.gauges import Gauges
from kinfer.tui.widgets.model_table import LEGEND, ModelTable
from kinfer.tui.widgets.pull_panel import PullPanel
from kinfer.tui.widgets.request_log import RequestLog
from kinfer.tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from kinfer.runtime import Runtime
    from kinfer.scheduler import Scheduler
    from kinfer.store.catalog import Store
    from kinfer.store.models import StoredModel
    from kinfer.tui.server_task import ServerTask

log = logging.getLogger(__name__)

REFRESH_S = 0.25  # 4 Hz at most: a 64-stream burst costs the server the same as one stream
STORE_REFRESH_S = 5.0  # the store re-reads the disk (a stat per file) to see other processes' pulls
PULL_LINGER_S = 6.0  # how long a finished pull's last line stays before the panel hides
THEMES = ("textual-dark", "textual-light")


class KinferDashboard(App[int]):
    """The dashboard. Everything it shows comes from `source`; `store`, `scheduler` and `server` are
    optional so that recorded screens (tests) need no runtime."""

    CSS_PATH = "app.tcss"
    TITLE = "kinfer"
    AUTO_FOCUS = "#models"
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (100, "-wide")]
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "pull", "Pull"),
        Binding("d", "delete", "Delete"),
        Binding("l", "toggle_load", "Load/unload"),
        Binding("s", "set_default", "Default"),
        Binding("x", "cancel_pull", "Stop pull"),
        Binding("t", "toggle_theme", "Theme"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False),
    ]

    def __init__(
        self,
        *,
        source: SampleSource,
        store: Store | None = None,
        scheduler: Scheduler | None = None,
        server: ServerTask | None = None,
        url: str = "",
        log_handler: QueueLogHandler | None = None,
        refresh_interval: float | None = REFRESH_S,
        store_interval: float | None = STORE_REFRESH_S,
        fade_seconds: float = FADE_SECONDS,
    ) -> None:
        super().__init__()
        self.source = source
        self.store = store
        self.scheduler = scheduler
        self.server = server
        self.url = url or (server.url if server is not None else "")
        self.log_handler = log_handler
        self.refresh_interval = refresh_interval
        self.store_interval = store_interval
        self.fade_seconds = fade_seconds
        self.rates = RateTracker()
        self.last_sample: DashboardSample | None = None
        self.ticks = 0
        self.tick_failures = 0  # ticks that raised (logged once); tests check it stays 0
        self._intervals: list[Timer] = []
        self._pull_cancel: threading.Event | None = None
        self._pull_number = 0
        self._quitting = False
        self._signals: list[int] = []

    def compose(self) -> ComposeResult:
        yield StatusBar(self.url, id="status")
        yield Gauges(history=HISTORY, id="gauges")
        yield BatchTable(id="batch", fade_seconds=self.fade_seconds)
        with Horizontal(id="bottom"):
            with Vertical(id="store"):
                yield ModelTable(id="models")
                yield PullPanel(id="pull")
            yield RequestLog(id="log")
        yield Footer()

    # ---- lifecycle ---------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.theme = THEMES[0]
        self.query_one("#gauges").border_title = "throughput and memory"
        self.query_one("#batch").border_title = "live batch"
        self.query_one("#store").border_title = "models"
        self.query_one("#store").border_subtitle = LEGEND
        self.query_one("#log").border_title = "requests"
        self.query_one("#log").border_subtitle = "tokens: prompt+reply"
        self.source.open()
        if self.server is not None:
            self.server.start(on_exit=self._server_exited)
            self._catch_signals()
        self.tick()
        self.refresh_store()
        if self.refresh_interval is not None:
            self._intervals.append(self.set_interval(self.refresh_interval, self.tick, name="kinfer-tick"))
        if self.store_interval is not None and self.store is not None:
            self._intervals.append(
                self.set_interval(self.store_interval, self.refresh_store, name="kinfer-store")
            )

    async def on_unmount(self) -> None:
        for timer in self._intervals:
            timer.stop()
        self._intervals.clear()
        if self._pull_cancel is not None:
            self._pull_cancel.set()
        self.source.close()
        loop = asyncio.get_running_loop()
        for signum in self._signals:
            loop.remove_signal_handler(signum)
        if self.server is not None and self.server.running:
            await self.server.stop()

    def _catch_signals(self) -> None:
        """SIGTERM / SIGHUP quit as the `q` key does, so the server still stops cleanly."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, lambda: self.run_worker(self.action_quit(), group="quit"))
                self._signals.append(signum)

    def _server_exited(self, error: BaseException | None) -> None:
        reason = f"{type(error).__name__}: {error}" if error else "it stopped"
        log.error("the server stopped: %s", reason)
        self.exit(1, message=f"kinfer: the server stopped ({reason})")

    # ---- the tick ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Read one sample and show it. A failure here is logged, never allowed to stop the server."""
        try:
            self.show(self.source())
        except Exception:
            if not self.tick_failures:  # once: a broken widget would otherwise log 4 times a second
                log.exception("the dashboard could not show a sample")
            self.tick_failures += 1

    def show(self, sample: DashboardSample) -> None:
        self.ticks += 1
        self.last_sample = sample
        rates = self.rates.update(sample.scheduler)
        self.query_one(StatusBar).show(sample)
        self.query_one(Gauges).show(sample, rates, self.rates.decode_history, self.rates.prompt_history)
        self.query_one(BatchTable).show(sample)
        names = frozenset(n for m in sample.scheduler.models for n in (m.names or (m.name,)))
        self.query_one(ModelTable).mark_loaded(names)
        request_log = self.query_one(RequestLog)
        request_log.add_entries(sample.finished)
        if self.log_handler is not None:
            request_log.add_log_lines(self.log_handler.drain())

    # ---- the store ---------------------------------------------------------------------------

    def refresh_store(self) -> None:
        if self.store is not None:
            self._list_store()

    @work(thread=True, exclusive=True, group="store-list")
    def _list_store(self) -> None:
        assert self.store is not None
        models = self.store.list()
        try:
            default = self.store.default_model()
        except KinferError as exc:  # the configured default is gone: still list the rest
            log.warning("%s", exc.message)
            default = None
        if self.is_running:  # a listing that lands as the dashboard closes has nowhere to go
            self.call_from_thread(self._show_store, models, default and default.name)

    def _show_store(self, models: list[StoredModel], default: str | None) -> None:
        """On the event loop (a worker thread must not query the widgets): the listing into the table,
        if there is one still; while the app closes its widgets go first, and a pull's listing thread
        that landed then failed the whole app (`NoMatches`)."""
        for table in self.query(ModelTable):
            table.show_models(models, default)

    def _selected(self) -> StoredModel | None:
        model = self.query_one(ModelTable).selected
        if model is None:
            self.notify("no model selected", severity="warning")
        return model

    def action_set_default(self) -> None:
        model = self._selected()
        if model is None or self.store is None:
            return
        try:
            self.store.set_default(model.name)
        except KinferError as exc:
            self.notify(exc.message, severity="error")
            return
        self.notify(f"{model.name} is the default model")
        self.refresh_store()

    def action_toggle_load(self) -> None:
        model = self._selected()
        if model is None:
            return
        if self.scheduler is None:
            self.notify("not attached to a server", severity="warning")
            return
        self._toggle_load(model)

    @work(group="load")
    async def _toggle_load(self, model: StoredModel) -> None:
        assert self.scheduler is not None
        try:
            if self.scheduler.find_loaded(model.name) is not None:  # under this name or another
                await self.scheduler.unload(model.name)
                self.notify(f"unloaded {model.name}")
            else:
                self.notify(f"loading {model.name}...")
                await self.scheduler.load(model.name)
                self.notify(f"loaded {model.name}")
        except KinferError as exc:
            self.notify(exc.message, severity="error", timeout=10)
        self.tick()

    def action_delete(self) -> None:
        model = self._selected()
        if model is None or self.store is None:
            return
        if not model.removable:
            how = "ships with kinfer" if model.source == "bundled" else f"is borrowed from {model.source}"
            self.notify(f"{model.name} {how}; kinfer does not delete it", severity="warning")
            return
        question = f"Delete {model.name} ({fmt.size(model.size)})?\nIts files are removed from disk."
        if model.is_alias:
            question = f"Delete the alias {model.name}? (the model {model.alias_of} stays)"

        def answered(yes: bool | None) -> None:
            if yes:
                self._delete(model)

        self.push_screen(ConfirmScreen(question, confirm_label="Delete"), answered)

    @work(group="delete")
    async def _delete(self, model: StoredModel) -> None:
        assert self.store is not None
        if self.scheduler is not None and not model.is_alias:  # an alias is only a name: its model stays
            await self.scheduler.unload(model.name)  # never delete files under a running engine
        try:
            await asyncio.to_thread(self.store.remove, model.name)
        except KinferError as exc:
            self.notify(exc.message, severity="error", timeout=10)
            return
        if self.scheduler is not None and model.alias_of is not None:
            self.scheduler.forget_alias(model.name, model.alias_of)
        self.notify(f"deleted {model.name}")
        self.refresh_store()

    # ---- pulls -------------------------------------------------------------------------------

    @property
    def pulling(self) -> bool:
        return self._pull_cancel is not None

    def action_pull(self) -> None:
        if self.store is None:
            self.notify("no store attached", severity="warning")
            return
        if self.pulling:
            self.notify("a pull is already running (x stops it)", severity="warning")
            return
        self.push_screen(PullScreen(), self.start_pull)

    def start_pull(self, ref: str | None) -> None:
        """Begin pulling `ref` in a worker thread; progress shows in the store panel."""
        if not ref or self.store is None or self.pulling:
            return
        self._pull_cancel = threading.Event()
        self._pull_number += 1
        self.query_one(PullPanel).begin(ref)
        self._run_pull(ref, self._pull_cancel, self._pull_number)

    def action_cancel_pull(self) -> None:
        if self._pull_cancel is not None:
            self._pull_cancel.set()
            self.notify("stopping the pull; what was fetched is kept for the next one")

    @work(group="pull")
    async def _run_pull(self, ref: str, cancel: threading.Event, number: int) -> None:
        """The pull runs on a thread of its own; its progress arrives here, on the app's loop."""
        from kinfer.store.background_pull import BackgroundPull
        from kinfer.store.transfer import PullCancelled

        assert self.store is not None
        panel = self.query_one(PullPanel)
        pulling = BackgroundPull(self.store, ref, cancel=cancel)
        try:
            async for event in pulling.events():
                panel.apply(event, time.monotonic())
        except PullCancelled:
            self._report_pull(number, "stopped; the next pull resumes it", True)
        except KinferError as exc:
            self._report_pull(number, exc.message, True)
        except Exception as exc:  # a network or disk error: show it, keep serving
            log.exception("pull of %s failed", ref)
            self._report_pull(number, f"{type(exc).__name__}: {exc}", True)
        else:
            assert pulling.model is not None
            self._report_pull(number, f"pulled {pulling.model.name}", False)

    def _report_pull(self, number: int, text: str, error: bool) -> None:
        """After quitting there is no screen left to tell."""
        if not self.is_running:
            log.info("pull: %s", text)
            return
        self._pull_ended(number, text, error)

    def _pull_ended(self, number: int, text: str, error: bool) -> None:
        self._pull_cancel = None
        panel = self.query_one(PullPanel)
        panel.end(text, error=error)
        self.notify(text, severity="error" if error else "information", timeout=8)
        self.refresh_store()

        def hide() -> None:
            if self._pull_number == number and not self.pulling:
                panel.hide()

        self.set_timer(PULL_LINGER_S, hide)

    # ---- the rest ----------------------------------------------------------------------------

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    async def action_quit(self) -> None:
        """Stop the server cleanly (open streams get a few seconds), then leave."""
        if self._quitting:
            return
        self._quitting = True
        if self._pull_cancel is not None:
            self._pull_cancel.set()  # what was fetched stays in partial/ for the next pull
        if self.server is not None and self.server.running:
            status = self.query_one(StatusBar)
            status.note = "stopping..."
            if self.last_sample is not None:
                status.show(self.last_sample)
            await self.server.stop()
        self.exit(0)


def make_dashboard(runtime: Runtime, sock: socket.socket, log_handler: QueueLogHandler | None = None):
    """The dashboard over `runtime`, serving on `sock` once it runs (see the module docstring)."""
    from kinfer.tui.live import LiveSource
    from kinfer.tui.server_task import ServerTask

    return KinferDashboard(
        source=LiveSource(runtime.scheduler, runtime.requests),
        store=runtime.store,
        scheduler=runtime.scheduler,
        server=ServerTask(runtime, sock),
        log_handler=log_handler,
    )


def run_dashboard(runtime: Runtime, sock: socket.socket) -> int:
    """Serve with the dashboard in this terminal until the user quits; returns the exit status."""
    # the request pane shows each request as an entry already: its log line would say it twice
    handler = QueueLogHandler(skip=(REQUEST_LOGGER,))
    with captured_logging(handler):
        app = make_dashboard(runtime, sock, handler)
        app.run()
    for line in handler.drain():  # what was logged after the screen went away
        if line.level >= logging.WARNING:
            log.log(line.level, "%s", line.text)
    return app.return_code or 0
