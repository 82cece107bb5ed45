"""Packages whose names import on first use (PEP 562): `import depthpack` (or depthpack.train, depthpack.data)
loads no torch, so a command reaches its one-line error contract (core.cli.run) before torch does."""
from __future__ import annotations

from typing import Any, Callable


def lazy_attributes(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """The module __getattr__ of `package`: each name in where comes from its (relative) module when first used."""
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(where[name], package), name)
    return __getattr__
