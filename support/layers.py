"""The package's modules by layer, read from the source tree (not imported): what the layer
tests of ``tests/unit/test_layers.py`` and ``tests/integration/test_fresh_imports.py`` check."""

from __future__ import annotations

from pathlib import Path

import celery_redlock

PACKAGE = Path(celery_redlock.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name, read from the tree."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()
#: The Redis layer: the ``_redis`` subpackage and the exceptions it raises.
REDIS_LAYER = sorted(
    m for m in MODULES if m.startswith("celery_redlock._redis") or m.endswith(".exceptions")
)
#: The Celery layer's internals.
CELERY_LAYER = sorted(m for m in MODULES if m.startswith("celery_redlock._celery"))
