"""Training methods by name. Adding a method = adding one module here with a `@register("name")` class."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from cheaptrain import UserError
from cheaptrain.methods.base import METHODS, Method, RunContext, register


def create_method(name: str, params: dict[str, Any] | None = None) -> Method:
    """The method `name` with its params section; raises ConfigError for bad parameters."""
    if name not in METHODS:
        raise UserError(f"unknown method {name!r} (accepted: {', '.join(METHODS)})")
    return METHODS[name](**(params or {}))


for _module in pkgutil.iter_modules(__path__):  # every module of this package registers its methods on import
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "Method", "RunContext", "create_method", "register"]
