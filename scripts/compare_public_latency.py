"""Compare the latency model with public measurements (configs/calibration/*.yaml).

Every point of the YAML is a figure someone published (a kernel profile, an operator table, an
end-to-end benchmark); this script prints it next to the matching term of our
:class:`~hexagent_gym.cluster.latency.LatencyModel` and the ratio ours / public, grouped by model x
GPU x TP x dtype, with a one-line summary per group (median ratio, points within 0.8-1.25x) and one
per operation. Nothing is fitted: it only reports (docs/calibration_public.md reads the result).

Usage:
    python scripts/compare_public_latency.py                     # every point, markdown
    python scripts/compare_public_latency.py --operation attention_decode --gpu h100
    python scripts/compare_public_latency.py --file my_points.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexagent_gym.cluster.cluster import DEFAULT_NETWORK_EFFICIENCY, load_cluster
from hexagent_gym.cluster.hardware import load_gpu, load_model
from hexagent_gym.cluster.latency import WEIGHT_DTYPES, LatencyModel, check_tp
from hexagent_gym.config import ConfigError, configs_dir, load_yaml, suggest

DEFAULT_FILE = configs_dir() / "calibration" / "public_measurements.yaml"
BAND = (0.8, 1.25)
"""A point 'agrees' when ours / public lies in this band."""

OPERATIONS: dict[str, tuple[str, str]] = {
    # operation: (phase, our matching term)
    "decode_step": ("decode", "decode_step_time(batch, batch x context)"),
    "prefill": ("prefill", "prefill_time(prompt)"),
    "ttft_pd": ("prefill", "prefill_time(prompt) + transfer_time(prompt)"),
    "kv_transfer": ("prefill", "transfer_time(prompt): setup + logical KV bytes / bandwidth"),
    "linear_decode": ("decode", "decode_breakdown 'linear' without the LM head"),
    "linear_prefill": ("prefill", "prefill_breakdown 'linear' (no LM head)"),
    "attention_decode": ("decode", "decode_breakdown 'attention'"),
    "attention_prefill": ("prefill", "prefill_breakdown 'attention'"),
    "moe_decode": ("decode", "decode_breakdown 'experts' + layers x moe_layer_overhead_us"),
    "moe_prefill": ("prefill", "prefill_breakdown 'experts' + layers x moe_layer_overhead_us"),
    "allreduce": ("decode", "decode_breakdown 'allreduce' (2 x layers calls of batch tokens)"),
    "elementwise_decode": ("decode", "none: norms, RoPE, activation, adds are not a term of ours"),
}
"""Every operation a point may name: its phase and the term of ours it is compared with."""

_REQUIRED = ("id", "model", "gpu", "tp", "dtype", "operation", "batch", "source", "note")
_OPTIONAL = ("context_tokens", "prompt_tokens", "measured_ms", "components", "repeat", "divide",
             "measured_gbs", "kv_gb", "link_gbs", "row")
_COMPONENT_FIELDS = ("what", "ms", "count")


@dataclass(frozen=True, slots=True)
class Component:
    """One published per-unit time (e.g. one layer's GEMM) that a figure is summed from."""

    what: str
    ms: float
    count: int = 1


@dataclass(frozen=True, slots=True)
class PublicPoint:
    """One published measurement and the instance / step it describes."""

    id: str
    model: str
    gpu: str
    tp: int
    dtype: str
    operation: str
    batch: int
    context_tokens: int
    prompt_tokens: int
    measured_ms: float
    """The public figure in ms: given, derived from ``components`` or from GB/s and bytes."""
    source: str
    note: str
    row: str = ""
    components: tuple[Component, ...] = ()
    repeat: int = 1
    divide: float = 1.0
    measured_gbs: float | None = None
    kv_gb: float | None = None
    link_gbs: float | None = None

    @property
    def group(self) -> tuple[str, str, int, str]:
        return (self.model, self.gpu, self.tp, self.dtype)

    @property
    def tokens(self) -> int:
        """The token count shown in tables: context per sequence (decode) or prompt (prefill)."""
        return self.context_tokens if OPERATIONS[self.operation][0] == "decode" \
            else self.prompt_tokens


def derive_measured_ms(components: Sequence[Component], repeat: int = 1,
                       divide: float = 1.0) -> float:
    """The figure a point's components stand for: ``repeat * sum(count * ms) / divide``.

    E.g. one layer's four linear GEMMs summed and multiplied by 80 layers, or an end-to-end
    latency divided by the output tokens.
    """
    return repeat * math.fsum(c.count * c.ms for c in components) / divide


# -------------------------------------------------------------------------------------------------
# Loading and validation


class _Entry:
    """Typed field access for one YAML entry; errors name the file, the entry and the field."""

    def __init__(self, data: Mapping[str, Any], index: int, source: str) -> None:
        self.data = data
        ident = data.get("id")
        label = f"'{ident}'" if isinstance(ident, str) and ident else "(no id)"
        self.where = f"{source}: entry {index} {label}"

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.where}: field '{key}' {problem}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.fail(key, "is missing (required)")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(key, f"must be {names}, got {value!r}")
        if isinstance(value, str) and not value.strip():
            raise self.fail(key, "must not be empty")
        return value

    def number(self, key: str, default: Any = ..., integer: bool = False,
               minimum: float = 0.0, strict: bool = True) -> Any:
        if self.data.get(key) is None:
            return self.get(key, float, default)  # the default, or the "missing" error
        value = self.get(key, int if integer else float)
        if value < minimum or strict and value == minimum:
            raise self.fail(key, f"must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
        return value


def _parse_point(data: Any, index: int, source: str) -> PublicPoint:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: entry {index}: expected a mapping, got {type(data).__name__}")
    e = _Entry(data, index, source)
    for key in data:
        if key not in _REQUIRED + _OPTIONAL:
            allowed = list(_REQUIRED + _OPTIONAL)
            raise e.fail(str(key), f"is unknown; valid fields: {', '.join(allowed)}."
                                   f"{suggest(str(key), allowed)}")
    values = {key: e.get(key, str).strip() for key in ("id", "model", "gpu", "source", "note")}
    for key, loader in (("model", load_model), ("gpu", load_gpu)):
        try:
            loader(values[key])
        except ConfigError as exc:
            raise e.fail(key, f"is invalid: {exc}") from None
    operation = e.get("operation", str)
    if operation not in OPERATIONS:
        raise e.fail("operation", f"must be one of {', '.join(OPERATIONS)}, got {operation!r}."
                                  f"{suggest(operation, list(OPERATIONS))}")
    dtype = e.get("dtype", str)
    if dtype not in WEIGHT_DTYPES:
        raise e.fail("dtype", f"must be one of {', '.join(WEIGHT_DTYPES)}, got {dtype!r}")
    tp = e.number("tp", ..., integer=True)
    try:
        check_tp(load_model(values["model"]), tp)
    except ConfigError as exc:
        raise e.fail("tp", f"is invalid: {exc}") from None
    phase = OPERATIONS[operation][0]
    context = e.number("context_tokens", ..., integer=True, strict=False) if phase == "decode" \
        else e.number("context_tokens", 0, integer=True, strict=False)
    prompt = e.number("prompt_tokens", ..., integer=True, minimum=1, strict=False) \
        if phase == "prefill" else e.number("prompt_tokens", 0, integer=True, strict=False)

    components: tuple[Component, ...] = ()
    repeat, divide = 1, 1.0
    measured_gbs = e.number("measured_gbs", None)
    kv_gb = e.number("kv_gb", None)
    link_gbs = e.number("link_gbs", None)
    if link_gbs is not None and operation not in ("kv_transfer", "ttft_pd"):
        raise e.fail("link_gbs", "applies only to kv_transfer and ttft_pd points")
    given = [key for key in ("measured_ms", "components") if data.get(key) is not None]
    if len(given) > 1:
        raise e.fail("measured_ms", "and 'components' are both given; give one")
    if "components" in given:
        raw = e.get("components", list)
        if not raw:
            raise e.fail("components", "must list at least one component")
        parsed = []
        for j, item in enumerate(raw):
            if not isinstance(item, Mapping) or set(item) - set(_COMPONENT_FIELDS) \
                    or "what" not in item or "ms" not in item:
                raise e.fail("components", f"item {j} must be a mapping with 'what', 'ms' and an "
                                           f"optional 'count', got {item!r}")
            c = _Entry(item, j, e.where)
            c.where = f"{e.where}: component {j}"
            parsed.append(Component(what=c.get("what", str),
                                    ms=c.number("ms"),
                                    count=c.number("count", 1, integer=True, minimum=1,
                                                   strict=False)))
        components = tuple(parsed)
        repeat = e.number("repeat", 1, integer=True, minimum=1, strict=False)
        divide = e.number("divide", 1.0)
        measured = derive_measured_ms(components, repeat, divide)
    else:
        for key in ("repeat", "divide"):
            if data.get(key) is not None:
                raise e.fail(key, "applies only together with 'components'")
        if given:
            measured = e.number("measured_ms")
        elif measured_gbs is not None and kv_gb is not None:
            measured = kv_gb / measured_gbs * 1e3
        else:
            raise e.fail("measured_ms", "is missing: give 'measured_ms', 'components', or (for "
                                        "kv_transfer) 'measured_gbs' with 'kv_gb'")
    return PublicPoint(
        id=values["id"], model=values["model"], gpu=values["gpu"],
        tp=tp, dtype=dtype, operation=operation,
        batch=e.number("batch", ..., integer=True), context_tokens=context, prompt_tokens=prompt,
        measured_ms=measured, source=values["source"], note=values["note"],
        row=e.get("row", str, ""), components=components, repeat=repeat, divide=divide,
        measured_gbs=measured_gbs, kv_gb=kv_gb, link_gbs=link_gbs)


def load_points(path: str | Path = DEFAULT_FILE) -> list[PublicPoint]:
    """Load and validate a public-measurement file.

    Raises:
        ConfigError: unreadable file, a missing or invalid field (the message names the entry and
            the field), or a duplicate id.
    """
    path = Path(path)
    data = load_yaml(path)
    if not isinstance(data, Mapping) or not isinstance(data.get("points"), list):
        raise ConfigError(f"{path}: expected a mapping with a 'points' list at the top level")
    points, seen = [], {}
    for index, raw in enumerate(data["points"]):
        point = _parse_point(raw, index, str(path))
        if point.id in seen:
            raise ConfigError(f"{path}: entry {index} '{point.id}': field 'id' repeats entry "
                              f"{seen[point.id]}")
        seen[point.id] = index
        points.append(point)
    return points


# -------------------------------------------------------------------------------------------------
# Our matching term


class OurModel:
    """Builds (and caches) the LatencyModels and clusters that points are compared with."""

    def __init__(self) -> None:
        self._latency: dict[tuple, LatencyModel] = {}
        self._clusters: dict[tuple, Any] = {}

    def latency(self, p: PublicPoint, lm_head: bool = True) -> LatencyModel:
        """The instance of a point; the fit check is off (``min_kv_tokens=1``), only times matter.

        ``lm_head=False`` gives the same instance with a one-token vocabulary, whose LM head
        (``2 x hidden`` bytes) is negligible: Vidur's and aiconfigurator's linear-layer figures
        contain no LM head, while our decode 'linear' term includes it.
        """
        key = (*p.group, lm_head)
        if key not in self._latency:
            model = load_model(p.model)
            if not lm_head:
                model = dataclasses.replace(model, vocab_size=1)
            self._latency[key] = LatencyModel(model, p.gpu, p.tp, weight_dtype=p.dtype,
                                              min_kv_tokens=1)
        return self._latency[key]

    def transfer_s(self, p: PublicPoint) -> float:
        """KV transfer time of the prompt between two instances of the point's kind.

        With ``link_gbs`` the pair's bandwidth is our default network efficiency times that line
        rate (so the set-up measured, not our default NICs, sets the bandwidth); the fixed setup
        and the logical KV bytes are ours.
        """
        key = (*p.group, p.link_gbs)
        if key not in self._clusters:
            spec: dict[str, Any] = {
                "name": f"public-{p.gpu}-tp{p.tp}", "model": p.model, "weight_dtype": p.dtype,
                "max_model_len": 1,
                "prefill": [{"gpu": p.gpu, "tp": p.tp}], "decode": [{"gpu": p.gpu, "tp": p.tp}]}
            if p.link_gbs is not None:
                spec["network"] = {"same_class_gbs": DEFAULT_NETWORK_EFFICIENCY * p.link_gbs}
            self._clusters[key] = load_cluster(spec)
        return self._clusters[key].transfer_time(0, 0, p.prompt_tokens)

    def seconds(self, p: PublicPoint) -> float | None:
        """Our time for what the point measured, in seconds; None when we have no such term."""
        op, b, s = p.operation, p.batch, p.prompt_tokens
        ctx = b * p.context_tokens
        lm = self.latency(p)
        moe_fixed = lm.model.num_hidden_layers * lm.gpu.efficiency.moe_layer_overhead_us * 1e-6
        if op in ("moe_decode", "moe_prefill") and not lm.model.is_moe:
            raise ConfigError(f"point '{p.id}': operation {op} needs an MoE model, "
                              f"{p.model} is dense")
        if op == "allreduce" and p.tp == 1:
            raise ConfigError(f"point '{p.id}': operation allreduce needs tp > 1")
        if op == "decode_step":
            return lm.decode_step_time(b, ctx)
        if op == "prefill":
            return lm.prefill_time(s)
        if op == "ttft_pd":
            return lm.prefill_time(s) + self.transfer_s(p)
        if op == "kv_transfer":
            return self.transfer_s(p)
        if op == "linear_decode":
            return self.latency(p, lm_head=False).decode_breakdown(b, 0)["linear"]
        if op == "linear_prefill":
            return lm.prefill_breakdown(s)["linear"]
        if op == "attention_decode":
            return lm.decode_breakdown(b, ctx)["attention"]
        if op == "attention_prefill":
            return lm.prefill_breakdown(s)["attention"]
        if op == "moe_decode":
            return lm.decode_breakdown(b, 0)["experts"] + moe_fixed
        if op == "moe_prefill":
            return lm.prefill_breakdown(s)["experts"] + moe_fixed
        if op == "allreduce":
            return lm.decode_breakdown(b, 0)["allreduce"]
        return None  # elementwise_decode


@dataclass(frozen=True, slots=True)
class Comparison:
    point: PublicPoint
    ours_ms: float | None

    @property
    def ratio(self) -> float | None:
        """ours / public (above 1: our model is slower than the measurement)."""
        return None if self.ours_ms is None else self.ours_ms / self.point.measured_ms

    @property
    def within(self) -> bool:
        return self.ratio is not None and BAND[0] <= self.ratio <= BAND[1]


def compare(points: Sequence[PublicPoint], model: OurModel | None = None) -> list[Comparison]:
    """Our figure for every point (with the shipped GPU and model YAML constants)."""
    model = model or OurModel()
    out = []
    for p in points:
        seconds = model.seconds(p)
        out.append(Comparison(p, None if seconds is None else seconds * 1e3))
    return out


# -------------------------------------------------------------------------------------------------
# Report


def summarize(rows: Sequence[Comparison]) -> tuple[float | None, int, int]:
    """(median ratio, points within the band, points with a ratio) of some comparisons."""
    ratios = [r.ratio for r in rows if r.ratio is not None]
    if not ratios:
        return None, 0, 0
    return statistics.median(ratios), sum(r.within for r in rows), len(ratios)


def _summary_text(rows: Sequence[Comparison]) -> str:
    median, within, n = summarize(rows)
    if median is None:
        return "no comparable points"
    return (f"median ours/public {median:.2f}; {within}/{n} within "
            f"{BAND[0]:g}-{BAND[1]:g}x")


def _fmt(ms: float) -> str:
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 1000 else f"{ms:.0f}"


def format_report(rows: Sequence[Comparison]) -> str:
    """Markdown: one table per model x GPU x TP x dtype with its summary line, then a summary per
    group and one per operation."""
    groups: dict[tuple, list[Comparison]] = {}
    for r in rows:
        groups.setdefault(r.point.group, []).append(r)
    # model, then BF16 before FP8, then GPU and TP; points keep their file order
    groups = dict(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][3] != "bf16",
                                                           kv[0][1], kv[0][2])))
    lines = []
    for (model, gpu, tp, dtype), members in groups.items():
        lines += [f"### {model} · {gpu.upper()} · TP{tp} · {dtype.upper()}", "",
                  "| id | operation | batch | ctx / prompt | public ms | ours ms | ours/public |",
                  "|---|---|---|---|---|---|---|"]
        for r in members:
            p = r.point
            ours = "—" if r.ours_ms is None else _fmt(r.ours_ms)
            ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
            lines.append(f"| {p.id} | {p.operation} | {p.batch} | {p.tokens} | "
                         f"{_fmt(p.measured_ms)} | {ours} | {ratio} |")
        lines += ["", f"Summary: {_summary_text(members)}.", ""]
    lines += ["### Summary per group", "", "| model | GPU | TP | dtype | points | median "
              "ours/public | within 0.8–1.25x |", "|---|---|---|---|---|---|---|"]
    for (model, gpu, tp, dtype), members in groups.items():
        median, within, n = summarize(members)
        med = "—" if median is None else f"{median:.2f}"
        lines.append(f"| {model} | {gpu.upper()} | {tp} | {dtype.upper()} | {n} | {med} | "
                     f"{within}/{n} |")
    lines += ["", "### Summary per operation", "",
              "| operation | points | median ours/public | within 0.8–1.25x | our term |",
              "|---|---|---|---|---|"]
    for op, (_, term) in OPERATIONS.items():
        members = [r for r in rows if r.point.operation == op]
        if not members:
            continue
        median, within, n = summarize(members)
        med = "—" if median is None else f"{median:.2f}"
        count = f"{within}/{n}" if n else f"0/0 ({len(members)} not comparable)"
        lines.append(f"| {op} | {len(members)} | {med} | {count} | {term} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DEFAULT_FILE), help="measurement YAML")
    parser.add_argument("--operation", choices=list(OPERATIONS), help="only this operation")
    parser.add_argument("--model", help="only this model name")
    parser.add_argument("--gpu", help="only this GPU name")
    args = parser.parse_args(argv)
    points = load_points(args.file)
    points = [p for p in points
              if (args.operation is None or p.operation == args.operation)
              and (args.model is None or p.model == args.model.lower())
              and (args.gpu is None or p.gpu == args.gpu.lower())]
    if not points:
        print("no points match")
        return 1
    print(format_report(compare(points)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
