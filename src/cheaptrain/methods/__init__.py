"""Training methods by name. Adding a method = adding one module here with a `@register("name")` class.

A params section `methods.<name>` configures the method of that name, or, with a `method:` key, the registered
method it names: `dfp_half: {method: dfp, prune_num: 0.5}` is DFP at another budget, run as `dfp_half`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from cheaptrain import UserError
from cheaptrain.methods.base import METHODS, Method, RunContext, register


def implementation(name: str, params: dict[str, Any] | None) -> str:
    """The registered method a params section configures: its `method:` key, else its own name."""
    return (params or {}).get("method", name)


def create_method(name: str, params: dict[str, Any] | None = None) -> Method:
    """The method configured by section `methods.<name>`; raises ConfigError for bad parameters."""
    params = dict(params or {})
    registered = params.pop("method", name)
    if registered not in METHODS:
        key = f"methods.{name}.method" if registered != name else f"method {name!r}"
        raise UserError(f"{key}: unknown method {registered!r} (accepted: {', '.join(METHODS)})")
    method = METHODS[registered].__new__(METHODS[registered])
    method.name = name  # its params' key in messages and logs: methods.<name>
    method.__init__(**params)
    return method


for _module in pkgutil.iter_modules(__path__):  # every module of this package registers its methods on import
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "Method", "RunContext", "create_method", "implementation", "register"]
