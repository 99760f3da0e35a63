"""YAML loading and name resolution for everything under ``configs/``.

Only this module reads YAML. Every error it raises names the file (and the line or field) and says
what would be valid, because configs are user input.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

CONFIG_KINDS = ("gpus", "models", "clusters", "experiments", "mixtures")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names where and what would be valid."""


def configs_dir() -> Path:
    """The directory holding the shipped YAML configs (installed as the ``configs`` package)."""
    return Path(str(resources.files("hexagent_gym.configs")))


def known_names(kind: str) -> list[str]:
    """Names of the shipped configs of one kind, e.g. ``known_names("gpus")``."""
    _check_kind(kind)
    folder = configs_dir() / kind
    return sorted(p.stem for p in folder.glob("*.yaml"))


def suggest(name: str, options: list[str]) -> str:
    """A ' Did you mean: `x`?' suffix (empty when nothing is close), like Gymnasium's registry."""
    close = difflib.get_close_matches(name, options, n=1)
    return f" Did you mean: `{close[0]}`?" if close else ""


def resolve_config(kind: str, name_or_path: str | Path) -> Path:
    """Find a config by shipped name (case-insensitive) or by file path.

    Raises:
        ConfigError: neither a readable file nor a shipped name; lists the shipped names.
    """
    _check_kind(kind)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{kind[:-1]} config file '{path}' does not exist")
        return path
    key = str(name_or_path).strip().lower()
    candidate = configs_dir() / kind / f"{key}.yaml"
    if candidate.is_file():
        return candidate
    names = known_names(kind)
    raise ConfigError(
        f"unknown {kind[:-1]} '{name_or_path}'; known: {', '.join(names)}.{suggest(key, names)} "
        f"(or pass a path to a .yaml file)"
    )


def load_yaml(path: str | Path) -> Any:
    """Parse one YAML file; syntax errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from exc


def load_named(kind: str, name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """Resolve and load a mapping config; returns (mapping, source label for error messages)."""
    path = resolve_config(kind, name_or_path)
    data = load_yaml(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return dict(data), str(path)


def field(data: Mapping[str, Any], key: str, source: str, kind: type | tuple[type, ...],
          default: Any = ..., positive: bool = False) -> Any:
    """Read one typed field of a config mapping with an error that names the source and field.

    Args:
        data: the mapping.
        key: field name.
        source: file path or label for messages, e.g. ``configs/gpus/a100.yaml``.
        kind: accepted Python type(s); ints are accepted where floats are.
        default: returned when the key is missing; without it the field is required.
        positive: require a value > 0 (numbers only).
    """
    if key not in data:
        if default is ...:
            raise ConfigError(f"{source}: missing required field '{key}'")
        return default
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"{source}: field '{key}' must be {names}, got {value!r}")
    if positive and not value > 0:
        raise ConfigError(f"{source}: field '{key}' must be > 0, got {value!r}")
    return value


def _check_kind(kind: str) -> None:
    if kind not in CONFIG_KINDS:
        raise ValueError(f"config kind must be one of {CONFIG_KINDS}, got {kind!r}")
