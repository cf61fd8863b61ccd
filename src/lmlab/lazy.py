"""Names imported on first use, so `import lmlab` and `lmlab --help` do not load torch and transformers.

`Lazy("pkg.module:function")` is a callable that imports its target on the first call (a study's run,
figure and verdict); `LazyValue("pkg.module:NAME")()` is the object NAME, imported on the first call (a study's
claims and tables); `lazy_exports(package, {"name": "submodule"})` is a module `__getattr__` that
imports `package.submodule` when `package.name` is first read.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def load(target: str) -> Any:
    """The object named "module:attribute"."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Lazy:
    def __init__(self, target: str):
        self.target = target
        self._fn: Callable | None = None

    def resolve(self) -> Callable:
        if self._fn is None:
            self._fn = load(self.target)
        return self._fn

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Lazy({self.target!r})"


class LazyValue:
    def __init__(self, target: str):
        self.target = target

    def __call__(self) -> Any:
        return load(self.target)

    def __repr__(self) -> str:
        return f"LazyValue({self.target!r})"


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    def __getattr__(name: str):
        if name in names:
            return load(f"{package}.{names[name]}:{name}")
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    return __getattr__
