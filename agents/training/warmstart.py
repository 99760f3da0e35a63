"""The warm start of a training run: imitate a teacher (behaviour cloning, DAgger,
temperature) before PPO, with ``hexagent_gym.agents.imitation``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.agents.imitation import (
    Demonstrations,
    behaviour_clone,
    calibrate_temperature,
    collect_demonstrations,
    dagger,
    imitation_loss,
)
from hexagent_gym.policy import make_policy

DEMO_SEED = 20_000
"""Reset seed of the first teacher episode cloned (the others follow it)."""
HELD_OUT_SEED = 30_000
"""Reset seed of the held-out teacher episode (warm-start statistics and temperature)."""


@dataclass(frozen=True)
class WarmStart:
    """What :func:`warm_start` did.

    Attributes:
        stats: ``samples`` (labelled states after DAgger) and ``imitation_loss``'s ``loss``,
            ``accuracy`` and ``exact`` on the held-out teacher episode, after any temperature
            change; ``logit_scale`` first when the temperature was calibrated (run.json's ``bc``).
        collect_s: seconds spent collecting the teacher's demonstrations.
        total_s: seconds of the whole warm start.
    """

    stats: dict[str, float]
    collect_s: float
    total_s: float


def warm_start(model: Any, env: Any, *, teacher: str | Any = "hexagent", episodes: int = 8,
               epochs: int = 3, lr: float = 3e-3, value_coef: float = 0.5,
               dagger_rounds: int = 2, dagger_episodes: int = 4, target_prob: float = 0.0,
               gamma: float = 0.995, seed: int = 0, logger: Any = None,
               verbose: int = 0, cache: Path | None = None) -> WarmStart:
    """Fit ``model.policy`` in place to a teacher before PPO (the PPO optimiser is untouched).

    Behaviour cloning on ``episodes`` teacher episodes (reset seeds :data:`DEMO_SEED` on), for
    ``epochs`` epochs at ``lr``, the critic regressing on the returns-to-go with weight
    ``value_coef``; then ``dagger_rounds`` DAgger rounds of ``dagger_episodes`` episodes each
    (``hexagent_gym.agents.imitation.dagger``); then, with ``target_prob`` > 0, lower the
    equivariant policy's logit scale until the teacher's pick gets that geometric-mean probability
    on the held-out episode (reset seed :data:`HELD_OUT_SEED`).

    Args:
        model: a MaskablePPO model.
        env: the env the teacher and learner are rolled through (a PDClusterEnv, possibly
            wrapped: its rewards, discounted by ``gamma``, are the critic's targets).
        teacher: a registered policy name (``hexagent_gym.policy.make_policy``) or an object
            with ``reset(sim)`` and ``pick(dp)``.
        seed: seed of the cloning's minibatch order (DAgger round r uses seed + r + 1).
        logger: an SB3 logger receiving ``bc/*`` after each epoch (step epoch + 1) and
            ``dagger/*`` after each round (step round + 1); None logs nothing.
        verbose: 1 prints a line per epoch, per round and a summary.
        cache: a ``.npz`` file of the teacher's cloning and held-out episodes
            (:func:`teacher_episodes`).

    Raises:
        TypeError: ``target_prob`` > 0 on a policy without a logit scale (not equivariant).
    """
    start = time.perf_counter()
    if isinstance(teacher, str):
        teacher = make_policy(teacher)
    cached = cache is not None and cache.exists()
    demos, held_out = teacher_episodes(env, teacher, episodes, gamma, cache)
    collect_s = time.perf_counter() - start
    if verbose:
        how = f"read from {cache}" if cached else f"{collect_s:.0f} s"
        print(f"[bc] {len(demos)} teacher-labelled states from {episodes} episodes ({how})",
              flush=True)

    def log_epoch(epoch: int, stats: dict[str, float]) -> None:
        if logger is not None:
            for k, v in stats.items():
                logger.record(f"bc/{k}", v)
            logger.record("bc/held_out_loss", imitation_loss(model.policy, held_out)["loss"])
            logger.dump(epoch + 1)
        if verbose:
            print(f"[bc] epoch {epoch + 1}: loss {stats['loss']:.4f}, accuracy "
                  f"{stats['accuracy']:.4f}, value loss {stats['value_loss']:.4f}", flush=True)

    def log_round(r: int, stats: dict[str, float]) -> None:
        if logger is not None:
            for k, v in stats.items():
                logger.record(f"dagger/{k}", v)
            logger.dump(r + 1)
        if verbose:
            print(f"[dagger] round {r + 1}: accuracy on the learner's own states "
                  f"{stats['on_policy_accuracy']:.4f} before refitting", flush=True)

    behaviour_clone(model.policy, demos, epochs=epochs, lr=lr, value_coef=value_coef, seed=seed,
                    log=log_epoch)
    if dagger_rounds:
        demos = dagger(model.policy, env, demos, rounds=dagger_rounds, episodes=dagger_episodes,
                       gamma=gamma, value_coef=value_coef, seed=seed, teacher=teacher,
                       log=log_round)
    stats: dict[str, float] = {}
    if target_prob > 0.0:
        stats["logit_scale"] = calibrate_temperature(model.policy, held_out, target_prob)
        if verbose:
            print(f"[bc] logit scale {stats['logit_scale']:.4f}: teacher pick probability "
                  f"{target_prob} on held-out states", flush=True)
    stats.update(samples=len(demos), **imitation_loss(model.policy, held_out))
    total_s = time.perf_counter() - start
    if verbose:
        print(f"[bc] {len(demos)} labelled states ({episodes} teacher episodes + "
              f"{dagger_rounds} DAgger rounds); held-out accuracy {stats['accuracy']:.4f} "
              f"({total_s:.0f} s)", flush=True)
    return WarmStart(stats, collect_s, total_s)


def teacher_episodes(env: Any, teacher: Any, episodes: int, gamma: float,
                     cache: Path | None = None) -> tuple[Demonstrations, Demonstrations]:
    """(cloning demonstrations, held-out demonstrations): the teacher's episodes at reset seeds
    :data:`DEMO_SEED` … and :data:`HELD_OUT_SEED`.

    With ``cache``, a file written by an earlier call with the same teacher (its ``repr``),
    episodes, ``gamma`` and env (settings, window and padding) is read instead of collecting;
    otherwise they are collected and written there. Collection is deterministic, so the file
    holds exactly what collecting again would give.

    Raises:
        ValueError: ``cache`` exists but was collected differently (the message says how).
    """
    meta = json.dumps({"teacher": repr(teacher), "episodes": episodes, "gamma": gamma,
                       "first_seed": DEMO_SEED, "held_out_seed": HELD_OUT_SEED,
                       "env": _env_identity(env)}, sort_keys=True, default=str)
    if cache is not None and cache.exists():
        with np.load(cache) as data:
            stored = str(data["meta"])
            if stored != meta:
                raise ValueError(f"{cache}: these demonstrations were collected with "
                                 f"{stored}, not {meta}; pass another demos path or delete "
                                 f"the file to collect again")
            arrays = dict(data)
        return (Demonstrations.from_arrays(arrays, "demo/"),
                Demonstrations.from_arrays(arrays, "held/"))
    demos = collect_demonstrations(env, range(DEMO_SEED, DEMO_SEED + episodes), gamma=gamma,
                                   teacher=teacher)
    held_out = collect_demonstrations(env, [HELD_OUT_SEED], gamma=gamma, teacher=teacher)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")  # complete files only: a killed run leaves none
        np.savez_compressed(tmp, meta=np.asarray(meta), **demos.arrays("demo/"),
                            **held_out.arrays("held/"))
        tmp.replace(cache)
    return demos, held_out


def _env_identity(env: Any) -> dict[str, Any]:
    """What fixes the episodes an env serves and how they are encoded."""
    base = env.unwrapped
    settings = getattr(base, "settings", None)
    return {"settings": settings if settings is not None else repr(base.config.replace(seed=0)),
            "k": base.k, "p_max": base.p_max, "d_max": base.d_max,
            "options": repr(base.options) if settings is None else repr(base.envs[0].options)}


__all__ = ["DEMO_SEED", "HELD_OUT_SEED", "WarmStart", "teacher_episodes", "warm_start"]
