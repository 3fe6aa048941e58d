"""Ask for what to pull: `owner/repo`, `owner/repo:QUANT`, `hf.co/...` or a file URL."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class PullScreen(ModalScreen[str | None]):
    """Enter pulls, Escape cancels (dismisses with None)."""

    DEFAULT_CSS = """
    PullScreen {
        align: center middle;
    }
    PullScreen > Vertical {
        width: 72;
        max-width: 95%;
        height: auto;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    PullScreen .hint {
        color: $text-muted;
        margin-top: 1;
    }
    """

    AUTO_FOCUS = "#ref"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Pull a model from the Hugging Face Hub")
            yield Input(placeholder="owner/repo or owner/repo:Q4_K_M", id="ref")
            yield Static("Enter to pull, Escape to cancel", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        ref = event.value.strip()
        if ref:
            self.dismiss(ref)

    def action_cancel(self) -> None:
        self.dismiss(None)
