"""A name → factory registry with loud duplicates and "Did you mean" errors (policies, rewards).

Factories may be callables or ``"module:attr"`` entry-point strings resolved on first use, as
Gymnasium registers environments, so a lower layer can name factories of a higher one without
importing it up front.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from hexagent_gym.config import suggest


class Registry:
    """Factories by case-insensitive name.

    Args:
        kind: what is registered, for messages ("policy", "reward").
        error: the exception type raised for unknown names.
    """

    def __init__(self, kind: str, error: type[Exception] = ValueError) -> None:
        self.kind = kind
        self.error = error
        self._entries: dict[str, str | Callable[..., Any]] = {}

    def register(self, name: str, entry: str | Callable[..., Any]) -> None:
        """Add ``entry`` under ``name``; a taken name raises ValueError (never a silent swap)."""
        key = name.lower()
        if key in self._entries:
            raise ValueError(f"a {self.kind} named '{key}' is already registered")
        self._entries[key] = entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def factory(self, name: str) -> Callable[..., Any]:
        """The factory registered as ``name`` (entry-point strings are imported now)."""
        key = str(name).lower()
        entry = self._entries.get(key)
        if entry is None:
            known = self.names()
            raise self.error(f"unknown {self.kind} '{name}'; known: "
                             f"{', '.join(known)}.{suggest(key, known)}")
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
        return entry
