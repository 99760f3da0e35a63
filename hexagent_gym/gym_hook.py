"""Register ``hexagent_gym/PDCluster-v0`` with gymnasium without importing gymnasium here.

Gymnasium >= 1.0 no longer loads entry-point plugins, and importing it from ``hexagent_gym``
would load it for every user of the simulator core. Instead, importing ``hexagent_gym``
registers the env ids at once when gymnasium is already loaded, or installs a one-shot import
finder that registers them right after gymnasium's own import finishes.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any


def _register_envs() -> None:
    from envs.registration import register_envs

    register_envs()


class _RegisterOnGymnasiumImport(importlib.abc.MetaPathFinder):
    """Registers the env ids right after gymnasium finishes importing, then steps aside.

    Gymnasium >= 1.0 no longer loads entry-point plugins, and importing it here would load it for
    every user of the simulator core. This finder only wraps gymnasium's own loader.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "gymnasium":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the remaining finders
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _register_envs()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install_gymnasium_hook() -> None:
    """Register the env ids now if gymnasium is loaded, else as soon as it is imported."""
    if "gymnasium" in sys.modules:
        _register_envs()
    elif not any(isinstance(f, _RegisterOnGymnasiumImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnGymnasiumImport())
