"""The warm start of a training run: imitate a teacher (behaviour cloning, DAgger,
temperature) before PPO, with ``agents.imitation``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agents.imitation import (
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
               verbose: int = 0) -> WarmStart:
    """Fit ``model.policy`` in place to a teacher before PPO (the PPO optimiser is untouched).

    Behaviour cloning on ``episodes`` teacher episodes (reset seeds :data:`DEMO_SEED` on), for
    ``epochs`` epochs at ``lr``, the critic regressing on the returns-to-go with weight
    ``value_coef``; then ``dagger_rounds`` DAgger rounds of ``dagger_episodes`` episodes each
    (``agents.imitation.dagger``); then, with ``target_prob`` > 0, lower the equivariant
    policy's logit scale until the teacher's pick gets that geometric-mean probability on the
    held-out episode (reset seed :data:`HELD_OUT_SEED`).

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

    Raises:
        TypeError: ``target_prob`` > 0 on a policy without a logit scale (not equivariant).
    """
    start = time.perf_counter()
    if isinstance(teacher, str):
        teacher = make_policy(teacher)
    demos = collect_demonstrations(env, range(DEMO_SEED, DEMO_SEED + episodes), gamma=gamma,
                                   teacher=teacher)
    held_out = collect_demonstrations(env, [HELD_OUT_SEED], gamma=gamma, teacher=teacher)
    collect_s = time.perf_counter() - start

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


__all__ = ["DEMO_SEED", "HELD_OUT_SEED", "WarmStart", "warm_start"]
