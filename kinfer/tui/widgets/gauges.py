"""Aggregate tok/s with sparklines, queue and rows, prefix-pool hits, and memory."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from kinfer.engines.memory_account import PARTS
from kinfer.tui import format as fmt
from kinfer.tui.rates import Rates
from kinfer.tui.sample import DashboardSample

# the memory account's parts (kinfer/engines/memory_account.py) in the words the gauge shows them
PART_LABELS = {part: {"kv": "KV"}.get(part, part) for part in PARTS}
OK_FINISHES = ("stop", "length", "tool_calls")
FAILED_FINISHES = ("error", "deadline")


def padded(history: Sequence[float], length: int) -> list[float]:
    """Zeros on the left: the line scrolls in from the right and its floor stays at 0 tok/s."""
    values = list(history)[-length:]
    return [0.0] * (length - len(values)) + values


def load_line(sample: DashboardSample) -> Text:
    snap = sample.scheduler
    busy = sum(m.rows_busy for m in snap.models)
    total = sum(m.rows_total for m in snap.models)
    lookups = sum(m.stats.prefix_lookups for m in snap.models)
    hits = sum(m.stats.prefix_hits for m in snap.models)
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("queue ", style="dim")
    line.append(str(snap.queue_depth), style="bold")
    line.append("  rows ", style="dim")
    line.append(f"{busy}/{total}", style="bold")
    line.append("  prefix hits ", style="dim")
    line.append(f"{hits / lookups:.0%} ({hits}/{lookups})" if lookups else "-", style="bold")
    outcomes = snap.outcomes
    line.append("  done ", style="dim")
    line.append(str(sum(outcomes.get(k, 0) for k in OK_FINISHES)), style="bold")
    for label, count in (
        ("cancelled", outcomes.get("cancelled", 0)),
        ("failed", sum(outcomes.get(k, 0) for k in FAILED_FINISHES)),
        ("rejected", outcomes.get("rejected", 0)),
    ):
        if count:
            line.append(f"  {label} ", style="dim")
            line.append(str(count), style="bold")
    line.append("  tokens ", style="dim")
    line.append(f"{fmt.tokens(snap.prompt_tokens_total)} in / {fmt.tokens(snap.generated_tokens_total)} out")
    return line


def memory_line(sample: DashboardSample) -> Text:
    system = sample.system
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("RSS ", style="dim")
    line.append(fmt.size(system.rss), style="bold")
    line.append("  system ", style="dim")
    line.append(f"{fmt.size(system.memory_used)}/{fmt.size(system.memory_total)}", style="bold")
    for index, gpu in enumerate(system.gpus):
        line.append(f"  GPU{index} ", style="dim")
        line.append(f"{fmt.size(gpu.used)}/{fmt.size(gpu.total)}", style="bold")
    return line


def engine_memory_line(sample: DashboardSample) -> Text:
    """The loaded models' memory account: the allocator's total against the budget, then the parts
    that hold anything (summed over models)."""
    engine: dict[str, int] = {}
    for model in sample.scheduler.models:
        for key, value in model.stats.memory.items():
            engine[key] = engine.get(key, 0) + value
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("engine ", style="dim")
    if "total" not in engine:
        line.append("-", style="bold")
        return line
    line.append(fmt.size(engine["total"]), style="bold")
    if engine.get("budget"):
        line.append(" of ", style="dim")
        line.append(fmt.size(engine["budget"]), style="bold")
    for part in PARTS:
        if engine.get(part):
            line.append(f"  {PART_LABELS[part]} ", style="dim")
            line.append(fmt.size(engine[part]), style="bold")
    return line


class Gauges(Vertical):
    """Four lines: rates with their history, load, process and machine memory, the engine's account."""

    DEFAULT_CSS = """
    Gauges {
        height: auto;
    }
    Gauges > Horizontal {
        height: 1;
    }
    Gauges .rate {
        width: 22;
    }
    Gauges Sparkline {
        width: 1fr;
        margin: 0 2 0 0;
    }
    Gauges .line {
        height: 1;
    }
    """

    def __init__(self, history: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history = history
        self._shown: dict[str, tuple] = {}

    def _set(self, widget_id: str, text: Text) -> None:
        """Update a line only when its text changed; its size never does, so no layout pass."""
        key = (text.plain, tuple(text.spans))
        if self._shown.get(widget_id) != key:
            self._shown[widget_id] = key
            self.query_one(f"#{widget_id}", Static).update(text, layout=False)

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static(id="decode-rate", classes="rate")
            yield Sparkline([], id="decode-spark")
            yield Static(id="prompt-rate", classes="rate")
            yield Sparkline([], id="prompt-spark")
        yield Static(id="load-line", classes="line")
        yield Static(id="memory-line", classes="line")
        yield Static(id="engine-memory-line", classes="line")

    def show(
        self,
        sample: DashboardSample,
        rates: Rates,
        decode_history: Sequence[float],
        prompt_history: Sequence[float],
    ) -> None:
        for name, value, history in (
            ("decode", rates.decode, decode_history),
            ("prompt", rates.prompt, prompt_history),
        ):
            label = Text.assemble((f"{name} ", "dim"), (f"{fmt.rate(value):>6}", "bold"), (" tok/s", "dim"))
            self._set(f"{name}-rate", label)
            self.query_one(f"#{name}-spark", Sparkline).data = padded(history, self.history)
        self._set("load-line", load_line(sample))
        self._set("memory-line", memory_line(sample))
        self._set("engine-memory-line", engine_memory_line(sample))
