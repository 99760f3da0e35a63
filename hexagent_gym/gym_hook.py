"""``import hexagent_gym`` registers the env ids with gymnasium, without importing gymnasium.

Gymnasium's convention is that importing the package that owns a namespace registers its ids
(``gym.make("hexagent_gym/PDCluster-v0")`` after ``import hexagent_gym``), but the core must not
load gymnasium (or torch) just to be imported. So registration waits for gymnasium:

- gymnasium already imported: the ``hexagent_gym.plugins`` entry points run now (the env's
  plug-in registers its ids);
- not yet: a one-shot import hook runs them right after ``import gymnasium`` completes, whichever
  code imports it.

The core never names the env package: registration goes through the same plug-in entry points
as ``hexagent_gym.make`` (:func:`hexagent_gym.policy.load_plugins`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

GYMNASIUM = "gymnasium"


class _RunAfterExec(importlib.abc.Loader):
    """Wraps gymnasium's loader: executes the module, then runs ``callback``."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._callback()


class _OnGymnasiumImport(importlib.abc.MetaPathFinder):
    """A meta-path finder that answers only for ``gymnasium``, once: it finds the real spec with
    the other finders and wraps its loader. It removes itself before looking, so it never
    recurses and never stays in ``sys.meta_path`` after gymnasium's import."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != GYMNASIUM:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(GYMNASIUM)
        if spec is None or spec.loader is None:
            return None  # gymnasium is not installed: the ordinary ImportError follows
        spec.loader = _RunAfterExec(spec.loader, self.callback)
        return spec


def when_gymnasium_imported(callback: Callable[[], None]) -> None:
    """Run ``callback`` now if gymnasium is imported, else right after its import completes."""
    if GYMNASIUM in sys.modules:
        callback()
        return
    if not any(isinstance(f, _OnGymnasiumImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnGymnasiumImport(callback))
