"""One line per finished HTTP request, and the server's log messages.

A generation shows its time, dialect, prompt+generated tokens, finish, duration and model; any other
request (`GET /api/tags`, a refusal) its time, dialect, status, duration, method and path."""

from __future__ import annotations

import logging

from rich.text import Text
from textual.widgets import RichLog

from kinfer.tui import format as fmt
from kinfer.tui.log_capture import LogLine
from kinfer.tui.sample import LogEntry

MAX_LINES = 1000
FINISH_STYLES = {"stop": "green", "length": "yellow", "tool_calls": "cyan", "cancelled": "dim"}


def entry_line(entry: LogEntry) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    # the model (or path) goes last: it is the longest field and, with one model loaded, the least telling
    line.append(fmt.clock(entry.finished_at), style="dim")
    line.append(f" {entry.dialect:<9}")
    if not entry.finish:
        # no tokens to show: the status, then the path, which is what tells these lines apart
        line.append(f" {entry.status or '-':>3}", style=status_style(entry.status))
        line.append(f" {fmt.seconds(entry.duration):>5}", style="dim")
        line.append(f" {entry.method} {entry.path}")
        return line
    line.append(f" {fmt.tokens(entry.prompt_tokens) + '+' + fmt.tokens(entry.generated):>7}")
    line.append(f" {entry.finish:<6}", style=FINISH_STYLES.get(entry.finish, "bold red"))
    line.append(f" {fmt.seconds(entry.duration):>5}", style="dim")
    line.append(f" {entry.model}", style="bold")
    return line


def status_style(status: int) -> str:
    if status >= 500 or not status:
        return "bold red"
    return "yellow" if status >= 400 else "green"


def log_line(record: LogLine) -> Text:
    style = (
        "bold red"
        if record.level >= logging.ERROR
        else "yellow"
        if record.level >= logging.WARNING
        else "dim"
    )
    return Text.assemble((fmt.clock(record.created), "dim"), " ", (record.text, style), no_wrap=True)


class RequestLog(RichLog):
    """Appends only; the newest line is at the bottom. Written once per tick, never per token."""

    DEFAULT_CSS = """
    RequestLog {
        height: 1fr;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=MAX_LINES, wrap=False, markup=False, auto_scroll=True, **kwargs)
        self.entries: list[LogEntry] = []  # what was logged, for tests and `kinfer ps`-like reading

    def add_entries(self, entries: tuple[LogEntry, ...] | list[LogEntry]) -> None:
        for entry in entries:
            self.write(entry_line(entry))
        self.entries.extend(entries)
        del self.entries[:-MAX_LINES]

    def add_log_lines(self, lines: list[LogLine]) -> None:
        for record in lines:
            self.write(log_line(record))
