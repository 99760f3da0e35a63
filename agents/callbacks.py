"""SB3 callback: evaluate the learner on fixed episodes next to HexAgent, log to TensorBoard.

Every ``eval_every`` environment steps (and once at the start and at the end of training)
:class:`RolloutEvalCallback` runs the current model deterministically, with the action masks, on
fixed evaluation episodes through ``env.rollout`` and records:

- ``eval/req95``, ``eval/req99``, ``eval/mean_ratio``, ``eval/attainment@<α>`` for each α,
  ``eval/scheduler_ms`` (wall ms per scheduling invocation, encoding + forward pass included);
- the same for the reference heuristic under ``hexagent/...`` (computed once, logged at every
  evaluation so the two curves share an axis);
- ``eval/attainment_curve``: a matplotlib figure of attainment against α, both policies;
- at training start, the run's hyperparameters (``HParam``) with the eval metrics as the
  HPARAMS tab's metrics.

Req values are means over the evaluation seeds; attainment and the curve pool every workflow of
those episodes. The best model by ``eval/req99`` can be saved as training goes.
:func:`plot_scalars` exports a run's scalar curves as a PNG (docs/img).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Figure, HParam

DEFAULT_ALPHAS = (1.25, 1.5, 2.0, 3.0)
_NO_TEXT = ("stdout", "log", "json", "csv")


def rollout_stats(results: Sequence[Any], alphas: Sequence[float]) -> dict[str, float]:
    """Summary of ``env.rollout`` results: mean Req95/Req99 over episodes, pooled attainment
    and mean ratio, scheduler ms per invocation."""
    ratios = np.concatenate([np.asarray(r.ratios, dtype=float) for r in results])
    invocations = sum(r.invocations for r in results)
    stats = {
        "req95": float(np.mean([r.req95 for r in results])),
        "req99": float(np.mean([r.req99 for r in results])),
        "mean_ratio": float(ratios.mean()) if len(ratios) else math.nan,
        "scheduler_ms": 1e3 * sum(r.scheduler_seconds for r in results) / max(invocations, 1),
    }
    for a in alphas:
        stats[f"attainment@{a:g}"] = float(np.mean(ratios <= a)) if len(ratios) else math.nan
    return stats


def attainment_figure(curves: Mapping[str, np.ndarray], title: str = "") -> Any:
    """Attainment (fraction of workflows with C_w/H_w ≤ α) against α for each named ratio set."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    hi = max([4.0] + [float(np.quantile(r, 0.995)) * 1.05 for r in curves.values() if len(r)])
    alphas = np.linspace(1.0, hi, 200)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, ratios in curves.items():
        r = np.sort(np.asarray(ratios, dtype=float))
        ax.plot(alphas, np.searchsorted(r, alphas, side="right") / max(len(r), 1), label=name)
    ax.set_xlabel("SLO scale α (C_w ≤ α·H_w)")
    ax.set_ylabel("attainment")
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


DEFAULT_PANELS = (
    ("eval Req99 (fixed episodes)", ("eval/req99", "hexagent/req99")),
    ("eval Req95", ("eval/req95", "hexagent/req95")),
    ("return vs HexAgent (train episodes)", ("rollout/ep_rew_mean",)),
    ("PPO", ("train/approx_kl", "train/clip_fraction")),
)


def read_scalars(logdir: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every scalar of a TensorBoard run directory: tag -> (steps, values)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: (np.array([e.step for e in acc.Scalars(tag)]),
                  np.array([e.value for e in acc.Scalars(tag)]))
            for tag in acc.Tags()["scalars"]}


# x units of the tags not logged at the env step: agents/training/warmstart.py logs the imitation
# stages before any env step, bc/* at epoch + 1 and dagger/* at round + 1
STEP_UNITS = (("bc/", "BC epoch"), ("dagger/", "DAgger round"))
ENV_STEPS = "env steps"


def step_unit(tag: str) -> str:
    """What a tag's TensorBoard step counts: :data:`STEP_UNITS`, else env steps."""
    return next((unit for prefix, unit in STEP_UNITS if tag.startswith(prefix)), ENV_STEPS)


def scalars_figure(logdir: str | Path,
                   panels: Sequence[tuple[str, Sequence[str]] | tuple[str, Sequence[str], str]]
                   = DEFAULT_PANELS) -> Any:
    """A matplotlib figure of a run's TensorBoard scalars, one panel per ``(title, tags)`` or
    ``(title, tags, x label)``.

    Each line's x data are the scalar events' own steps (never their index). A panel's x label
    is the given one, else the tags' step units joined (:func:`step_unit`: env steps unless the
    tag is logged per epoch or round). Env-step axes get engineering ticks (``20k``, ``1.5M``),
    per-epoch axes integer ticks, at most 5 either way, so labels do not collide at the figure's
    width. The y label names the scalar: the tags' last path components, joined by " / "
    (``eval/req99`` and ``hexagent/req99`` share ``req99``). Tags missing from the run are
    skipped. The caller closes the figure.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    data = read_scalars(logdir)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        title, tags = panel[0], tuple(panel[1])
        units = list(dict.fromkeys(step_unit(t) for t in tags))
        xlabel = panel[2] if len(panel) > 2 else " / ".join(units)
        for tag in tags:
            if tag in data:
                steps, values = data[tag]
                ax.plot(steps, values, marker="." if len(steps) < 40 else None, label=tag)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(" / ".join(dict.fromkeys(t.rsplit("/", 1)[-1] for t in tags)))
        if units == [ENV_STEPS]:
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        else:  # epochs and rounds are whole numbers
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_scalars(logdir: str | Path, out: str | Path,
                 panels: Sequence[tuple[str, Sequence[str]] | tuple[str, Sequence[str], str]]
                 = DEFAULT_PANELS) -> Path:
    """Export TensorBoard scalars of a run as one PNG (:func:`scalars_figure`); returns ``out``
    (its folder is created)."""
    import matplotlib.pyplot as plt

    fig = scalars_figure(logdir, panels)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


class RolloutEvalCallback(BaseCallback):
    """Periodic deterministic evaluation of the model against a reference heuristic.

    Args:
        eval_env: a PDClusterEnv used only for evaluation (its config sets the episodes).
        eval_every: environment steps (summed over sub-envs) between evaluations.
        seeds: reset seeds of the evaluation episodes (fixed for the whole run).
        alphas: α values logged as ``eval/attainment@<α>``.
        reference: policy name evaluated once and logged under ``<reference>/...``.
        hparams: extra hyperparameters for the HPARAMS tab (the model's own are added).
        best_model_path: if set, the model with the lowest ``eval/req99`` so far is saved here.
        verbose: 1 prints one line per evaluation.
    """

    def __init__(self, eval_env: Any, eval_every: int = 10_000, seeds: Sequence[int] = (10_000,),
                 alphas: Sequence[float] = DEFAULT_ALPHAS, reference: str = "hexagent",
                 hparams: Mapping[str, Any] | None = None,
                 best_model_path: str | Path | None = None, verbose: int = 0) -> None:
        super().__init__(verbose)
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1 step, got {eval_every}")
        if not seeds:
            raise ValueError("seeds must list at least one evaluation episode")
        self.eval_env = eval_env
        self.eval_every = int(eval_every)
        self.seeds = tuple(int(s) for s in seeds)
        self.alphas = tuple(float(a) for a in alphas)
        self.reference = reference
        self.hparams = dict(hparams or {})
        self.best_model_path = Path(best_model_path) if best_model_path else None
        self.reference_stats: dict[str, float] = {}
        self.reference_ratios = np.zeros(0)
        self.history: list[dict[str, float]] = []
        self.best_req99 = math.inf
        self.best_step = -1
        self._last_eval = -1
        self._evaluated_updates = -1  # the model's PPO update count at the last evaluation

    # -- hooks ----------------------------------------------------------------------------------
    def _on_training_start(self) -> None:
        env = self.eval_env
        ref = [env.rollout(self.reference, seed=s) for s in self.seeds]
        self.reference_stats = rollout_stats(ref, self.alphas)
        self.reference_ratios = np.concatenate([r.ratios for r in ref])
        self.logger.record("hparams", HParam(self._hparam_dict(), {
            "eval/req99": 0.0, "eval/req95": 0.0, "eval/mean_ratio": 0.0}), exclude=_NO_TEXT)
        self._evaluate()

    def _on_step(self) -> bool:
        if self.num_timesteps - self._last_eval >= self.eval_every:
            self._evaluate()
        return True

    def _on_training_end(self) -> None:
        # An evaluation triggered by the last rollout's final step ran before that rollout's
        # PPO update: evaluate again whenever the weights changed since, so the final evaluation
        # is always the saved model's.
        if (self._last_eval != self.num_timesteps
                or getattr(self.model, "_n_updates", -1) != self._evaluated_updates):
            self._evaluate()

    # -- work -----------------------------------------------------------------------------------
    def _hparam_dict(self) -> dict[str, Any]:
        m = self.model
        out: dict[str, Any] = {"algorithm": type(m).__name__,
                               "policy": type(m.policy).__name__}
        for name in ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda",
                     "ent_coef", "vf_coef", "max_grad_norm", "n_envs", "seed"):
            v = getattr(m, name, None)
            if v is None:
                continue
            out[name] = v if isinstance(v, bool | int | float | str) else str(v)
        clip = getattr(m, "clip_range", None)
        if callable(clip):
            out["clip_range"] = float(clip(1.0))
        for k, v in self.hparams.items():
            out[k] = v if isinstance(v, bool | int | float | str) else str(v)
        return out

    def evaluate_model(self) -> tuple[dict[str, float], np.ndarray]:
        """Roll the current model out on every evaluation seed (deterministic, masked)."""
        results = [self.eval_env.rollout(self.model, seed=s, deterministic=True)
                   for s in self.seeds]
        return rollout_stats(results, self.alphas), np.concatenate([r.ratios for r in results])

    def _evaluate(self) -> None:
        self._last_eval = self.num_timesteps
        self._evaluated_updates = getattr(self.model, "_n_updates", -1)
        stats, ratios = self.evaluate_model()
        for key, value in stats.items():
            self.logger.record(f"eval/{key}", value)
        for key, value in self.reference_stats.items():
            self.logger.record(f"{self.reference}/{key}", value)
        fig = attainment_figure({"learned": ratios, self.reference: self.reference_ratios},
                                title=f"step {self.num_timesteps}")
        self.logger.record("eval/attainment_curve", Figure(fig, close=True), exclude=_NO_TEXT)
        self.logger.dump(self.num_timesteps)
        self.history.append({"timesteps": self.num_timesteps, **stats})
        if stats["req99"] < self.best_req99:
            self.best_req99, self.best_step = stats["req99"], self.num_timesteps
            if self.best_model_path is not None:
                self.model.save(self.best_model_path)
        if self.verbose:
            ref = self.reference_stats
            print(f"[eval] step {self.num_timesteps}: req99 {stats['req99']:.3f} "
                  f"(best {self.best_req99:.3f} @ {self.best_step}), req95 {stats['req95']:.3f}, "
                  f"mean {stats['mean_ratio']:.3f} | {self.reference} req99 {ref['req99']:.3f}, "
                  f"req95 {ref['req95']:.3f}", flush=True)


__all__ = ["DEFAULT_ALPHAS", "DEFAULT_PANELS", "RolloutEvalCallback", "attainment_figure",
           "plot_scalars", "read_scalars", "rollout_stats"]
