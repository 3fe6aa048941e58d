"""How route handlers reach the runtime the app was built with (no module globals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import current_app

if TYPE_CHECKING:
    from kinfer.runtime import Runtime


def runtime() -> Runtime:
    return current_app.extensions["kinfer"]
