"""Imitating ``hexagent-horizon`` with the equivariant network reading workflow futures
(docs/learned_futures.md).

:func:`train_futures` builds a :class:`~hexagent_gym.envs.mixture.MixtureEnv` with the
``workflow`` observation key, a MaskablePPO model whose equivariant policy reads it
(``workflow_feature=True``), and fits the policy to ``hexagent-horizon`` by behaviour cloning and
DAgger (``hexagent_gym.agents.imitation``). The teacher ranks by risk over max(H_w(t), Ĥ_w) with
Ĥ_w the episode's horizon forecast, which the env shows the learner in the same key, so the
learner sees everything the teacher uses and nothing a serving front end would not know.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexagent_gym.agents.equivariant_policy import make_model
from hexagent_gym.agents.imitation import (
    behaviour_clone,
    collect_demonstrations,
    dagger,
    imitation_loss,
)
from hexagent_gym.envs.mixture import MixtureEnv
from hexagent_gym.policy import make_policy


@dataclass(frozen=True)
class FuturesConfig:
    """One imitation run.

    Attributes:
        seed: the training seed: network initialisation, minibatch order, and which episodes
            are demonstrated (episode seeds ``1000 · seed + i``, DAgger's from
            ``1000 · seed + 500``), so training seeds see different data.
        teacher: registered policy name of the teacher.
        teacher_kwargs: its arguments. The default teacher ranks every workflow by its own
            max(H_w(t), Ĥ_w) (``one_scale=False``): with the one-scale rule, decisions of the
            synthetic family that show a workflow the gate leaves out are ranked by running
            horizons, and a network imitating that learned to ignore the forecast (asym-2p8d
            +1.0 %, +0.9 %, −5.2 % for training seeds 0–2, against +31–37 % without it).
        bc_episodes: teacher episodes cloned first; 0: no training at all (the network's prior
            alone, the baseline that shows what imitation adds).
        bc_epochs, lr: behaviour-cloning epochs and Adam learning rate.
        dagger_rounds, dagger_episodes: DAgger rounds and the learner's episodes per round.
        dagger_lr: Adam learning rate of DAgger's refits on the aggregated states: lower than
            cloning's, because at 1e-3 a refit could undo the clone (two of three training
            seeds ended at 59-64 % agreement with the teacher on its own states).
        hidden: embedding width of the equivariant network.
        prior: initial weight of the network's indicators (the forecast-riskiest call, its
            argmin-Δ pair). 0 (the default): the network starts with no rule and learns the
            ranking from imitation alone; 4: it starts on the teacher's rule, which it then
            keeps (docs/learned_futures.md: the untrained network already scores the same).
        value_coef: weight of the critic's regression on returns (kept for a PPO fine-tune).
    """

    seed: int = 0
    teacher: str = "hexagent-horizon"
    teacher_kwargs: tuple[tuple[str, Any], ...] = (("one_scale", False),)
    bc_episodes: int = 8
    bc_epochs: int = 3
    lr: float = 1e-3
    dagger_rounds: int = 2
    dagger_episodes: int = 3
    dagger_lr: float = 3e-4
    hidden: int = 64
    prior: float = 0.0
    value_coef: float = 0.5


def train_futures(mixture: str | Mapping[str, Any], config: FuturesConfig = FuturesConfig(),
                  log: Callable[[str], None] | None = None) -> tuple[Any, dict[str, float]]:
    """Fit a fresh equivariant model reading the ``workflow`` key to the teacher on ``mixture``.

    Returns:
        (the MaskablePPO model, statistics: ``samples``, ``bc_accuracy`` after cloning,
        ``dagger_accuracy`` (the last round's, on the learner's own states before refitting),
        ``seconds``).
    """
    say = log or (lambda _msg: None)
    start = time.perf_counter()
    env = MixtureEnv(mixture, seed=config.seed, workflow_obs=True)
    model = make_model(env, "equivariant", seed=config.seed, device="cpu",
                       policy_kwargs={"workflow_feature": True, "hidden": config.hidden,
                                      "prior": config.prior})
    teacher = make_policy(config.teacher, **dict(config.teacher_kwargs))
    base = 1000 * config.seed
    if config.bc_episodes == 0:  # the untrained network: its prior alone, for comparison
        if config.dagger_rounds:
            raise ValueError("DAgger refits cloned states: bc_episodes must be >= 1 with "
                             "dagger_rounds > 0")
        nan = float("nan")
        return model, {"bc_accuracy": nan, "dagger_accuracy": nan, "samples": 0.0,
                       "train_accuracy": nan, "seconds": time.perf_counter() - start}
    demos = collect_demonstrations(env, range(base, base + config.bc_episodes), teacher=teacher)
    say(f"[seed {config.seed}] {len(demos)} teacher states from {config.bc_episodes} episodes "
        f"({time.perf_counter() - start:.0f} s)")
    hist = behaviour_clone(model.policy, demos, epochs=config.bc_epochs, lr=config.lr,
                           value_coef=config.value_coef, seed=config.seed,
                           log=lambda e, s: say(f"[seed {config.seed}] bc epoch {e + 1}: "
                                                f"loss {s['loss']:.3f} accuracy "
                                                f"{s['accuracy']:.3f}"))
    stats = {"bc_accuracy": hist[-1]["accuracy"] if hist else float("nan")}
    rounds: list[dict[str, float]] = []
    if config.dagger_rounds:

        def log_round(r: int, s: dict[str, float]) -> None:
            rounds.append(s)
            say(f"[seed {config.seed}] dagger round {r + 1}: accuracy on own states "
                f"{s['on_policy_accuracy']:.3f}")

        demos = dagger(model.policy, env, demos, rounds=config.dagger_rounds,
                       episodes=config.dagger_episodes, first_seed=base + 500, epochs=2,
                       lr=config.dagger_lr, value_coef=config.value_coef, seed=config.seed,
                       teacher=teacher, log=log_round)
    stats["dagger_accuracy"] = rounds[-1]["on_policy_accuracy"] if rounds else float("nan")
    stats["samples"] = float(len(demos))
    stats["train_accuracy"] = imitation_loss(model.policy, demos.subset(
        np.arange(min(len(demos), 2048))))["accuracy"]
    stats["seconds"] = time.perf_counter() - start
    return model, stats


__all__ = ["FuturesConfig", "train_futures"]
