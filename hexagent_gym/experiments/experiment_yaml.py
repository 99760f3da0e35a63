"""Reading an experiment (``configs/experiments/*.yaml``, a path, or a mapping) into the
:mod:`~hexagent_gym.experiments.grid` model, with errors that name the file and the key.

The schema is documented in ``docs/evaluation.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError, suggest
from hexagent_gym.episode import EPISODE_KEYS, EXPERIMENT_META_KEYS, EpisodeConfig, load_config
from hexagent_gym.experiments.grid import (
    Experiment,
    Grid,
    PolicySpec,
    Report,
    check_clusters,
    check_traces,
)
from hexagent_gym.policy import make_policy, policy_names

TOP_LEVEL_KEYS = EXPERIMENT_META_KEYS  # the keys load_config leaves for us (and the env ignores)
GRID_KEYS = ("policies", "clusters", "traces", "seeds", "loads", "estimation_errors",
             "per_trace", "variants", "policy_kwargs")
POLICY_ENTRY_KEYS = ("name", "label", "kwargs")
"""Keys of a mapping entry of ``grid.policies`` (a bare string entry is a policy name)."""
REPORT_KEYS = ("metrics", "reference", "baselines", "overhead", "by_size")
# Episode fields a per-trace entry or a variant may set (the axes set the others).
_SETTABLE = tuple(k for k in EPISODE_KEYS if k not in ("cluster", "trace", "seed"))


def load_experiment(config: str | Path | Mapping[str, Any] | None = None) -> Experiment:
    """Read an experiment: a shipped name (``table1``), a YAML path, a mapping or None.

    Top-level keys are :class:`~hexagent_gym.episode.EpisodeConfig` fields (the settings every
    cell starts from) plus ``name``, ``description``, ``grid`` and ``report``; the schema is in
    ``docs/evaluation.md``. Errors name the file and the key.

    Raises:
        ConfigError: unknown or ill-typed keys, unknown policies, clusters or traces, policy
            arguments the policy rejects, duplicated policy labels.
    """
    base, rest, source = load_config(config)
    for k in rest:
        if k not in TOP_LEVEL_KEYS:
            known = list(TOP_LEVEL_KEYS) + list(EPISODE_KEYS)
            raise ConfigError(f"{source}: unknown key '{k}'; known keys: {', '.join(known)}."
                              f"{suggest(k, known)}")
    name = rest.get("name")
    if name is None:
        name = Path(source).stem if source.endswith((".yaml", ".yml")) else "experiment"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: key 'name' must be a non-empty string, got {name!r}")
    description = rest.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError(f"{source}: key 'description' must be a string, got {description!r}")
    grid = _parse_grid(rest.get("grid") or {}, base, source)
    report = _parse_report(rest.get("report") or {}, source, grid.labels)
    try:
        grid.cells()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return Experiment(name, grid, report, description.strip(), source)


def _parse_grid(data: Any, base: EpisodeConfig, source: str) -> Grid:
    where = f"{source}: grid"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping of axis lists, got {type(data).__name__}")
    _check_keys(data, GRID_KEYS, where)
    kw: dict[str, Any] = {"base": base}
    if "policies" in data:
        kw["policies"] = _parse_policies(data["policies"], f"{where}.policies")
    if "clusters" in data:
        kw["clusters"] = _str_list(data, "clusters", where)
        check_clusters(kw["clusters"], f"{where}.clusters")
    if "traces" in data:
        kw["traces"] = _str_list(data, "traces", where)
        check_traces(kw["traces"], f"{where}.traces")
    if "seeds" in data:
        kw["seeds"] = _num_list(data, "seeds", where, int)
    if "loads" in data:
        kw["loads"] = _num_list(data, "loads", where, float)
    if "estimation_errors" in data:
        kw["estimation_errors"] = _num_list(data, "estimation_errors", where, float)
    traces = kw.get("traces") or (base.trace,)
    per = data.get("per_trace") or {}
    if not isinstance(per, Mapping):
        raise ConfigError(f"{where}.per_trace must map trace names to settings, got "
                          f"{type(per).__name__}")
    per_trace = {}
    for t, settings in per.items():
        if t not in traces:
            raise ConfigError(f"{where}.per_trace: '{t}' is not one of the grid's traces "
                              f"({', '.join(traces)}).{suggest(str(t), list(traces))}")
        per_trace[t] = _settings(settings, f"{where}.per_trace.{t}", base)
    variants = []
    raw_variants = data.get("variants") or {}
    if not isinstance(raw_variants, Mapping):
        raise ConfigError(f"{where}.variants must map variant names to episode settings, got "
                          f"{type(raw_variants).__name__}")
    for vname, settings in raw_variants.items():
        variants.append((str(vname), _settings(settings or {}, f"{where}.variants.{vname}",
                                               base)))
    kwargs = data.get("policy_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where}.policy_kwargs must map policy names to arguments")
    policy_kwargs = {}
    for pname, args in kwargs.items():
        if not isinstance(args, Mapping):
            raise ConfigError(f"{where}.policy_kwargs.{pname} must be a mapping of arguments")
        _check_arguments(str(pname), args, f"{where}.policy_kwargs.{pname}")
        policy_kwargs[str(pname).lower()] = dict(args)
    # an entry's own arguments go on top of its policy's policy_kwargs: check the two together
    for i, entry in enumerate(kw.get("policies", ())):
        if isinstance(entry, PolicySpec) and entry.kwargs:
            _check_arguments(entry.name, {**policy_kwargs.get(entry.name, {}), **entry.kwargs},
                             f"{where}.policies[{i}].kwargs")
    kw.update(per_trace=per_trace, variants=tuple(variants), policy_kwargs=policy_kwargs)
    try:
        return Grid(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse_policies(value: Any, where: str) -> tuple[str | PolicySpec, ...]:
    """``grid.policies``: bare names stay lower-case strings (their cells are unchanged by the
    entry form); ``{name, label, kwargs}`` mappings become :class:`PolicySpec` entries."""
    if isinstance(value, str | Mapping):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of policy names or "
                          f"{{name, label, kwargs}} mappings, got {value!r}")
    known = policy_names()
    out: list[str | PolicySpec] = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if isinstance(entry, str):
            out.append(entry.lower())
            continue
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{at} must be a policy name or a mapping with keys "
                              f"{', '.join(POLICY_ENTRY_KEYS)}, got {entry!r}")
        _check_keys(entry, POLICY_ENTRY_KEYS, at)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{at}.name must be a registered policy name, got {name!r}")
        if name.lower() not in known:
            raise ConfigError(f"{at}.name: unknown policy '{name}'; known policies: "
                              f"{', '.join(known)}.{suggest(name.lower(), known)}")
        label = entry.get("label", name)
        if not isinstance(label, str) or not label.strip() or label != label.strip():
            raise ConfigError(f"{at}.label must be a non-empty string without surrounding "
                              f"spaces, got {label!r}")
        kwargs = entry.get("kwargs") or {}
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"{at}.kwargs must be a mapping of constructor arguments by "
                              f"name, got {kwargs!r}")
        out.append(PolicySpec(name, label, dict(kwargs)))
    return tuple(out)


def _check_arguments(policy: str, args: Mapping[str, Any], where: str) -> None:
    """Build the policy once so arguments it rejects fail at load time, naming ``where``."""
    try:
        make_policy(policy, **args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _parse_report(data: Any, source: str, labels: Sequence[str] = ()) -> Report:
    where = f"{source}: report"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    _check_keys(data, REPORT_KEYS, where)
    kw: dict[str, Any] = {}
    if "metrics" in data:
        kw["metrics"] = _str_list(data, "metrics", where)
    if "reference" in data:
        if not isinstance(data["reference"], str):
            raise ConfigError(f"{where}.reference must be a policy name")
        kw["reference"] = data["reference"].lower()
    if "baselines" in data:
        kw["baselines"] = tuple(b.lower() for b in _str_list(data, "baselines", where))
    if "overhead" in data:
        if not isinstance(data["overhead"], bool):
            raise ConfigError(f"{where}.overhead must be true or false, got {data['overhead']!r}")
        kw["overhead"] = data["overhead"]
    if "by_size" in data:
        kw["by_size"] = data["by_size"]
    names = policy_names()
    known = names + [x for x in labels if x not in names]
    for p in ([kw["reference"]] if "reference" in kw else []) + list(kw.get("baselines", ())):
        if p not in known:
            raise ConfigError(f"{where}: unknown policy '{p}'; known: {', '.join(known)}."
                              f"{suggest(p, known)}")
    try:
        return Report(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_keys(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    for k in data:
        if k not in known:
            raise ConfigError(f"{where}: unknown key '{k}'; known keys: {', '.join(known)}."
                              f"{suggest(str(k), list(known))}")


def _str_list(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    v = data[key]
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}.{key} must be a non-empty list of strings, got {v!r}")
    return tuple(v)


def _num_list(data: Mapping[str, Any], key: str, where: str, kind: type) -> tuple[Any, ...]:
    v = data[key]
    if isinstance(v, int | float) and not isinstance(v, bool):
        v = [v]
    ok = isinstance(v, list) and v and all(
        isinstance(x, int if kind is int else int | float) and not isinstance(x, bool) for x in v)
    if not ok:
        raise ConfigError(f"{where}.{key} must be a non-empty list of "
                          f"{'integers' if kind is int else 'numbers'}, got {v!r}")
    return tuple(kind(x) for x in v)


def _settings(data: Any, where: str, base: EpisodeConfig) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping of episode settings, got "
                          f"{type(data).__name__}")
    _check_keys(data, _SETTABLE, where)
    try:
        base.replace(**data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return dict(data)
