"""The store: every model kinfer can serve, whether it is loaded, and which one is the default."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from kinfer.store.models import StoredModel
from kinfer.tui import format as fmt

NAME_WIDTH = 28  # longer names end in an ellipsis, so size and engine stay on screen
COLUMNS = (  # key, label, width (None: fit the names)
    ("mark", "", 2),
    ("name", "NAME", None),
    ("size", "SIZE", 7),
    ("engine", "ENGINE", 9),
    ("source", "SOURCE", 7),
)
LEGEND = "● loaded  ★ default"


def mark_text(loaded: bool, default: bool) -> Text:
    text = Text()
    text.append("●" if loaded else " ", style="bold green")
    text.append("★" if default else " ", style="bold yellow")
    return text


class ModelTable(DataTable):
    """Rows keyed by model name; the cursor row is the model the store actions act on."""

    DEFAULT_CSS = """
    ModelTable {
        height: 1fr;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.models: dict[str, StoredModel] = {}
        self.default_name: str | None = None
        self.loaded: frozenset[str] = frozenset()  # the names the loaded models were asked by
        self._listing: tuple | None = None

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, width=width, key=key)

    @property
    def selected(self) -> StoredModel | None:
        if not self.models or not 0 <= self.cursor_row < self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self.models.get(key or "")

    def show_models(self, models: list[StoredModel], default_name: str | None) -> None:
        """Rebuild the rows when the listing changed; keep the cursor on the same model."""
        ordered = sorted(models, key=lambda m: m.name.lower())
        listing = (tuple((m.name, m.size, m.source, m.format) for m in ordered), default_name)
        if listing == self._listing:
            return
        self._listing = listing
        keep = self.selected.name if self.selected is not None else None
        self.models = {m.name: m for m in ordered}
        self.default_name = default_name
        self.clear()
        marked = self._marked()
        width = min(NAME_WIDTH, max((len(m.name) for m in ordered), default=4))
        for model in ordered:
            self.add_row(
                mark_text(model.name in marked, model.name == default_name),
                Text(model.name[: width - 1] + "…" if len(model.name) > width else model.name),
                fmt.size(model.size),
                model.engine,
                model.source,
                key=model.name,
            )
        if keep in self.models:
            self.move_cursor(row=self.get_row_index(keep))

    def mark_loaded(self, names: frozenset[str]) -> None:
        """Update the marks from the names the scheduler's loaded models were asked by (every tick;
        nothing to do when unchanged)."""
        if names == self.loaded:
            return
        before = self._marked()
        self.loaded = names
        after = self._marked()
        for name in before ^ after:
            self.update_cell(name, "mark", mark_text(name in after, name == self.default_name))

    def _marked(self) -> frozenset[str]:
        """The rows to mark loaded: a loaded name's row and every other name of the same model (an
        alias and its target share one engine, whichever was asked)."""
        loaded = {self.models[n].alias_of or n for n in self.loaded if n in self.models}
        return frozenset(n for n, m in self.models.items() if (m.alias_of or n) in loaded)
