"""The store panel: what it lists, and deleting (with confirmation) and marking the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinfer.store.catalog import Store
from kinfer.tui.screens.confirm import ConfirmScreen
from kinfer.tui.widgets.model_table import ModelTable
from tests.tui.conftest import idle_sample, recorded_app, workers_settled

pytestmark = pytest.mark.asyncio
SIZE = (120, 36)


async def listed(pilot) -> ModelTable:
    await workers_settled(pilot.app)
    await pilot.pause()
    return pilot.app.query_one(ModelTable)


async def select(pilot, name: str) -> None:
    table = pilot.app.query_one(ModelTable)
    table.move_cursor(row=table.get_row_index(name))
    await pilot.pause()
    assert table.selected is not None and table.selected.name == name


async def test_the_store_lists_the_bundled_model_and_dropped_in_ggufs(store: Store) -> None:
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        table = await listed(pilot)
        assert sorted(table.models) == ["smollm2:135m", "tiny-chat", "tiny-q8"]
        row = table.get_row("smollm2:135m")
        assert [str(cell) for cell in row[1:]] == ["smollm2:135m", "94 MiB", "llama.cpp", "bundled"]
        assert table.get_row("tiny-q8")[4] == "kinfer"


async def test_delete_asks_first_and_removes_the_model(store: Store, kinfer_home: Path) -> None:
    doomed = kinfer_home / "models" / "tiny-chat.gguf"
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        await listed(pilot)
        await select(pilot, "tiny-chat")

        await pilot.press("d")
        assert isinstance(pilot.app.screen, ConfirmScreen)
        assert "tiny-chat" in pilot.app.screen.question
        await pilot.press("n")  # changed our mind: nothing happens
        await workers_settled(pilot.app)
        assert not isinstance(pilot.app.screen, ConfirmScreen)
        assert doomed.exists()

        await pilot.press("d")
        await pilot.click("#yes")
        table = await listed(pilot)
        assert not doomed.exists()
        assert "tiny-chat" not in table.models
        assert sorted(m.name for m in store.list()) == ["smollm2:135m", "tiny-q8"]


async def test_the_bundled_model_is_never_offered_for_deletion(store: Store) -> None:
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        await listed(pilot)
        await select(pilot, "smollm2:135m")
        await pilot.press("d")
        assert not isinstance(pilot.app.screen, ConfirmScreen)
        assert any("ships with kinfer" in n.message for n in pilot.app._notifications)
        assert "smollm2:135m" in {m.name for m in store.list()}


async def test_set_default_marks_the_model_in_the_store(store: Store) -> None:
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        table = await listed(pilot)
        assert table.default_name == "tiny-q8"  # the newest model on disk, until one is chosen
        await select(pilot, "smollm2:135m")
        await pilot.press("s")
        table = await listed(pilot)
        assert store.default_model().name == "smollm2:135m"
        assert table.default_name == "smollm2:135m"
        assert "★" in str(table.get_row("smollm2:135m")[0])
        assert "★" not in str(table.get_row("tiny-q8")[0])


async def test_load_needs_a_server(store: Store) -> None:
    """A recorded dashboard has no scheduler: load says so instead of failing."""
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        await listed(pilot)
        await pilot.press("l")
        assert any("not attached" in n.message for n in pilot.app._notifications)


async def test_t_toggles_between_the_dark_and_the_light_theme(store: Store) -> None:
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        assert pilot.app.theme == "textual-dark"
        await pilot.press("t")
        assert pilot.app.theme == "textual-light"
        await pilot.press("t")
        assert pilot.app.theme == "textual-dark"


async def test_an_alias_and_its_model_show_loaded_together(store: Store) -> None:
    """They share one engine, whichever name loaded it (the scheduler keys models by their files)."""
    store.copy("tiny-chat", "my-chat")
    async with recorded_app([idle_sample()], store).run_test(size=SIZE) as pilot:
        table = await listed(pilot)

        def marked() -> list[str]:
            return sorted(name for name in table.models if "●" in str(table.get_row(name)[0]))

        table.mark_loaded(frozenset({"my-chat"}))  # loaded by the alias
        assert marked() == ["my-chat", "tiny-chat"]
        table.mark_loaded(frozenset({"tiny-chat"}))  # by the model's own name
        assert marked() == ["my-chat", "tiny-chat"]
        table.mark_loaded(frozenset({"tiny-q8"}))
        assert marked() == ["tiny-q8"]
