"""The HexAgent paper's (arXiv 2605.16637) table numbers as data: ``configs/paper/tables.yaml``
read into :class:`PaperTables` of :class:`PaperClaim` s, with errors naming the entry and the field
(``hexagent_gym.experiments.paper_validation`` puts our results next to them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError, configs_dir, load_named, load_yaml, suggest

KINDS = ("cell", "mean_reduction", "order", "range")
NUMERIC_KINDS = ("cell", "mean_reduction", "range")
"""Claim kinds that carry a paper number (counted within range or not)."""
_COMMON = ("id", "kind", "metric", "source", "quoted_in")
_KEYS = {
    "cell": _COMMON + ("model", "cluster", "paper_cluster", "trace", "policy", "value"),
    "mean_reduction": _COMMON + ("models", "clusters", "traces", "reference", "baselines",
                                 "value"),
    "order": _COMMON + ("models", "clusters", "traces", "above", "below"),
    "range": _COMMON + ("models", "clusters", "traces", "policy", "low", "high"),
}
_OPTIONAL = {"paper_cluster", "quoted_in"}
_TABLE_KEYS = ("title", "experiment", "missing", "claims")


@dataclass(frozen=True)
class PaperClaim:
    """One paper number (or direction) and where it comes from.

    Attributes:
        id: unique name, e.g. ``table4-mean-reduction-req99``.
        table: the table group it belongs to (``table1``, ``table2_3``, ...).
        kind: ``cell``, ``mean_reduction``, ``order`` or ``range``.
        metric: ``req95``, ``req99``, ... or ``scheduler_ms_per_invocation``.
        source: where in the paper, e.g. ``arXiv 2605.16637, Table 4``.
        quoted_in: where this repository states it ("" when not given).
        models: model config names of the scope (one for a cell).
        clusters: our cluster configs of the scope (one for a cell).
        traces: trace names of the scope (one for a cell).
        policy: the cell's or the range's policy ("" otherwise).
        reference: the policy whose reduction a ``mean_reduction`` states.
        baselines: the paper's baseline set of a ``mean_reduction``.
        above: an ``order``'s policy with the higher Req.
        below: an ``order``'s policy with the lower Req.
        value: the paper's number (a reduction as a fraction); None for order and range.
        low: a range's lower end.
        high: a range's upper end.
        paper_cluster: the paper's name of the cell's cluster ("" when not given).
    """

    id: str
    table: str
    kind: str
    metric: str
    source: str
    quoted_in: str = ""
    models: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    traces: tuple[str, ...] = ()
    policy: str = ""
    reference: str = ""
    baselines: tuple[str, ...] = ()
    above: str = ""
    below: str = ""
    value: float | None = None
    low: float | None = None
    high: float | None = None
    paper_cluster: str = ""

    @property
    def numeric(self) -> bool:
        """True for a claim that carries a paper number (counted within range or not)."""
        return self.kind in NUMERIC_KINDS

    @property
    def rows(self) -> list[tuple[str, str]]:
        """The (cluster, trace) rows of the claim's scope, clusters first."""
        return [(c, t) for c in self.clusters for t in self.traces]

    def paper_text(self) -> str:
        """The paper's side as the report prints it."""
        if self.kind == "mean_reduction":
            return f"{100 * self.value:.1f}%"
        if self.kind == "order":
            return f"{self.above} > {self.below}"
        if self.kind == "range":
            return f"{self.low:g}–{self.high:g}"
        return f"{self.value:.2f}"


@dataclass(frozen=True)
class PaperTable:
    """One table group of the data file: its claims, the experiment that answers them (None:
    none does), and what the repository does not state (``missing``)."""

    name: str
    title: str
    experiment: str | None
    claims: tuple[PaperClaim, ...]
    missing: str = ""


@dataclass(frozen=True)
class PaperTables:
    """The whole data file: the paper it quotes and its tables in file order."""

    paper: str
    tables: tuple[PaperTable, ...]
    source: str = ""

    def claims(self) -> list[PaperClaim]:
        """Every claim of every table, in file order."""
        return [c for t in self.tables for c in t.claims]

    def select(self, names: Sequence[str] | None) -> PaperTables:
        """The tables named (None: all). Raises ConfigError for an unknown name."""
        if names is None:
            return self
        known = [t.name for t in self.tables]
        for n in names:
            if n not in known:
                raise ConfigError(f"unknown paper table '{n}'; known: {', '.join(known)}."
                                  f"{suggest(n, known)}")
        return PaperTables(self.paper, tuple(t for t in self.tables if t.name in names),
                           self.source)


def default_paper_file() -> Path:
    """``configs/paper/tables.yaml`` of this checkout."""
    return configs_dir() / "paper" / "tables.yaml"


def load_paper_tables(path: str | Path | None = None, *,
                      check_models: bool = True) -> PaperTables:
    """Read and validate the paper's numbers.

    Args:
        path: the YAML file (None: :func:`default_paper_file`).
        check_models: check that each cluster config's model is one of the claim's models and
            that every listed model has a cluster (reads the cluster configs).

    Raises:
        ConfigError: unreadable file, unknown or missing keys, ill-typed values, a duplicate id,
            a cluster whose model does not match; the message names the file and the entry.
    """
    path = Path(path) if path is not None else default_paper_file()
    if not path.is_file():
        raise ConfigError(f"paper numbers file '{path}' does not exist (the shipped one is "
                          f"configs/paper/tables.yaml of the repository)")
    data = load_yaml(path)
    src = str(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{src}: expected a mapping with 'paper' and 'tables'")
    _keys(data, ("paper", "tables"), src, required=("paper", "tables"))
    paper = data["paper"]
    if not isinstance(paper, str) or not paper:
        raise ConfigError(f"{src}: 'paper' must be a non-empty string, got {paper!r}")
    if not isinstance(data["tables"], Mapping) or not data["tables"]:
        raise ConfigError(f"{src}: 'tables' must be a non-empty mapping of table groups")
    tables, ids = [], set()
    for name, body in data["tables"].items():
        where = f"{src}: tables.{name}"
        if not isinstance(body, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(body).__name__}")
        _keys(body, _TABLE_KEYS, where, required=("title", "experiment", "claims"))
        experiment = body["experiment"]
        if experiment is not None and not isinstance(experiment, str):
            raise ConfigError(f"{where}.experiment: expected a name or null, got {experiment!r}")
        if not isinstance(body["claims"], list):
            raise ConfigError(f"{where}.claims: expected a list, got "
                              f"{type(body['claims']).__name__}")
        claims = []
        for i, entry in enumerate(body["claims"]):
            claim = _claim(entry, str(name), f"{where}.claims[{i}]")
            if claim.id in ids:
                raise ConfigError(f"{where}.claims[{i}]: duplicate id '{claim.id}'")
            ids.add(claim.id)
            if check_models:
                _check_models(claim, f"{where}.claims[{i}]")
            claims.append(claim)
        if claims and experiment is None:
            raise ConfigError(f"{where}: claims need an experiment that answers them")
        tables.append(PaperTable(str(name), _text(body["title"]), experiment, tuple(claims),
                                 _text(body.get("missing") or "")))
    return PaperTables(paper, tuple(tables), src)


def _text(v: Any) -> str:
    return " ".join(str(v).split())


def _keys(data: Mapping[str, Any], allowed: Sequence[str], where: str,
          required: Sequence[str] = ()) -> None:
    for k in data:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown key '{k}'; known: {', '.join(allowed)}."
                              f"{suggest(str(k), list(allowed))}")
    for k in required:
        if k not in data:
            raise ConfigError(f"{where}: missing key '{k}'")


def _claim(entry: Any, table: str, where: str) -> PaperClaim:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    allowed = _KEYS[kind]
    _keys(entry, allowed, where, required=[k for k in allowed if k not in _OPTIONAL])

    def string(k: str) -> str:
        v = entry[k]
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(f"{where}.{k}: expected a non-empty string, got {v!r}")
        return _text(v)

    def strings(k: str) -> tuple[str, ...]:
        v = entry[k]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
            raise ConfigError(f"{where}.{k}: expected a non-empty list of names, got {v!r}")
        return tuple(v)

    def number(k: str) -> float:
        v = entry[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}.{k}: expected a finite number, got {v!r}")
        return float(v)

    kw: dict[str, Any] = {"id": string("id"), "table": table, "kind": kind,
                          "metric": string("metric"), "source": string("source")}
    if "quoted_in" in entry:
        kw["quoted_in"] = string("quoted_in")
    if not kw["source"].startswith("arXiv"):
        raise ConfigError(f"{where}.source: cite the paper ('arXiv 2605.16637, Table N'), got "
                          f"{kw['source']!r}")
    if kind == "cell":
        kw.update(models=(string("model"),), clusters=(string("cluster"),),
                  traces=(string("trace"),), policy=string("policy"), value=number("value"))
        if "paper_cluster" in entry:
            kw["paper_cluster"] = string("paper_cluster")
    else:
        kw.update(models=strings("models"), clusters=strings("clusters"),
                  traces=strings("traces"))
    if kind == "mean_reduction":
        kw.update(reference=string("reference"), baselines=strings("baselines"),
                  value=number("value"))
        if not -1.0 < kw["value"] < 1.0:
            raise ConfigError(f"{where}.value: a reduction is a fraction in (-1, 1) (0.13 = 13% "
                              f"lower), got {kw['value']!r}")
    elif kind == "order":
        kw.update(above=string("above"), below=string("below"))
    elif kind == "range":
        kw.update(policy=string("policy"), low=number("low"), high=number("high"))
        if not 0 < kw["low"] <= kw["high"]:
            raise ConfigError(f"{where}: expected 0 < low <= high, got {kw['low']!r}.."
                              f"{kw['high']!r}")
    elif kw["value"] <= 0:
        raise ConfigError(f"{where}.value: a cell value must be > 0, got {kw['value']!r}")
    return PaperClaim(**kw)


def _check_models(claim: PaperClaim, where: str) -> None:
    seen = set()
    for c in claim.clusters:
        try:
            data, _ = load_named("clusters", c)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        model = str(data.get("model", "")).lower()
        if model not in [m.lower() for m in claim.models]:
            raise ConfigError(f"{where}: cluster '{c}' runs model '{model}', not one of the "
                              f"claim's models {', '.join(claim.models)}")
        seen.add(model)
    extra = [m for m in claim.models if m.lower() not in seen]
    if extra:
        raise ConfigError(f"{where}: model(s) {', '.join(extra)} have no cluster in the claim")


# ---------------------------------------------------------------------------------------------
# Our side: records grouped into rows
