"""Behaviour cloning from HexAgent: a warm start for PPO.

:func:`collect_demonstrations` steps a :class:`~hexagent_gym.envs.pd_cluster_env.PDClusterEnv` and,
at every step, asks the teacher (``HexAgentPolicy.pick(env.decision_point)``, encoded with
``env.encode_action``) what it would do; it records (observation, mask, teacher action) and the
discounted return-to-go of the env's reward. With ``learner`` and ``beta < 1`` the executed action
is the learner's with probability 1 − β (DAgger-style: states the learner reaches, labelled by
the teacher). :func:`behaviour_clone` then fits the policy's masked action distribution to the
teacher by masked cross-entropy (−log of the probability the policy gives, under the env's mask,
to the teacher's action or an exactly equivalent one: same call, a pair with the same Δ) and,
optionally, the value head to the returns, so PPO starts from HexAgent's behaviour with a
calibrated critic.

Works for any MaskablePPO policy (``EquivariantPolicy`` or ``MultiInputPolicy``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from torch import nn

from hexagent_gym.agents.hexagent import HexAgentPolicy


@dataclass
class Demonstrations:
    """Stacked (observation, mask, teacher action, return-to-go) samples.

    Attributes:
        obs: Dict observation arrays, each with a leading sample axis.
        masks: (N, A) bool action masks.
        actions: (N,) teacher actions.
        targets: (N, A) bool, the actions equivalent to the teacher's: the same call at a pair
            with the same projected completion Δ (identical idle instances tie exactly, and an
            equivariant policy cannot prefer one copy over the other; HexAgent's argmin just
            takes the lowest index).
        returns: (N,) discounted returns-to-go of the executed trajectory.
        episodes: number of episodes collected.
    """

    obs: dict[str, np.ndarray]
    masks: np.ndarray
    actions: np.ndarray
    targets: np.ndarray
    returns: np.ndarray
    episodes: int = 0

    def __len__(self) -> int:
        return len(self.actions)

    def subset(self, index: np.ndarray) -> Demonstrations:
        return Demonstrations({k: v[index] for k, v in self.obs.items()}, self.masks[index],
                              self.actions[index], self.targets[index], self.returns[index],
                              self.episodes)

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Every field as a flat name → array mapping (for ``np.savez``); :meth:`from_arrays`
        inverts it."""
        out = {f"{prefix}obs/{k}": v for k, v in self.obs.items()}
        out.update({f"{prefix}masks": self.masks, f"{prefix}actions": self.actions,
                    f"{prefix}targets": self.targets, f"{prefix}returns": self.returns,
                    f"{prefix}episodes": np.asarray(self.episodes)})
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str = "") -> Demonstrations:
        """The demonstrations :meth:`arrays` wrote under ``prefix``."""
        head = f"{prefix}obs/"
        obs = {k[len(head):]: np.asarray(v) for k, v in arrays.items() if k.startswith(head)}
        return cls(obs, np.asarray(arrays[f"{prefix}masks"]),
                   np.asarray(arrays[f"{prefix}actions"]), np.asarray(arrays[f"{prefix}targets"]),
                   np.asarray(arrays[f"{prefix}returns"]), int(arrays[f"{prefix}episodes"]))

    @classmethod
    def concat(cls, parts: Sequence[Demonstrations]) -> Demonstrations:
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("no demonstrations to concatenate")
        return cls({k: np.concatenate([p.obs[k] for p in parts]) for k in parts[0].obs},
                   np.concatenate([p.masks for p in parts]),
                   np.concatenate([p.actions for p in parts]),
                   np.concatenate([p.targets for p in parts]),
                   np.concatenate([p.returns for p in parts]),
                   sum(p.episodes for p in parts))


def collect_demonstrations(env: Any, seeds: Iterable[int], *, teacher: Any = None,
                           gamma: float = 0.99, learner: Any = None, beta: float = 1.0,
                           deterministic: bool = True,
                           rng: np.random.Generator | None = None) -> Demonstrations:
    """Label every step of one episode per seed with the teacher's pick.

    Args:
        env: a PDClusterEnv (wrappers are unwrapped for the decision point).
        seeds: reset seeds, one episode each.
        teacher: an object with ``reset(sim)`` and ``pick(dp)`` (default HexAgent).
        gamma: discount of the returns-to-go.
        learner: a model with ``predict(obs, action_masks=..., deterministic=...)``; with
            ``beta < 1`` it executes the step with probability 1 − β.
        beta: probability of executing the teacher's action.
        deterministic: the learner acts by argmax (True: the states its greedy rollout, which
            is what evaluation runs, reaches) or by sampling.
        rng: generator of the teacher/learner coin flips.

    Returns:
        The samples of every step (the labels are always the teacher's).
    """
    teacher = teacher if teacher is not None else HexAgentPolicy()
    rng = rng if rng is not None else np.random.default_rng(0)
    if beta < 1.0 and learner is None:
        raise ValueError(f"beta={beta} < 1 executes learner actions; pass learner=")
    base = env.unwrapped
    obs_rows: dict[str, list[np.ndarray]] = {}
    masks, actions, targets, returns = [], [], [], []
    n_episodes = 0
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        teacher.reset(base.simulator)
        rewards = []
        while True:
            mask = base.action_masks()
            slot, p, d = teacher.pick(base.decision_point)
            label = base.encode_action(slot, p, d)
            for key, value in obs.items():
                obs_rows.setdefault(key, []).append(value)
            masks.append(mask)
            actions.append(label)
            targets.append(equivalent_actions(obs["delta"], mask, slot, p, d))
            act = label
            if beta < 1.0 and rng.random() >= beta:
                a, _ = learner.predict(obs, action_masks=mask, deterministic=deterministic)
                act = int(np.asarray(a).reshape(-1)[0])
            obs, reward, terminated, truncated, _ = env.step(act)
            rewards.append(reward)
            if terminated or truncated:
                break
        g = 0.0
        rtg = np.empty(len(rewards))
        for i in range(len(rewards) - 1, -1, -1):
            g = rewards[i] + gamma * g
            rtg[i] = g
        returns.append(rtg)
        n_episodes += 1
    if not actions:
        raise ValueError("no seeds given: nothing collected")
    return Demonstrations({k: np.stack(v) for k, v in obs_rows.items()},
                          np.stack(masks), np.asarray(actions, dtype=np.int64),
                          np.stack(targets), np.concatenate(returns).astype(np.float32), n_episodes)


def equivalent_actions(delta: np.ndarray, mask: np.ndarray, slot: int, p: int, d: int,
                       rtol: float = 1e-6) -> np.ndarray:
    """Flat bool mask of the valid actions equivalent to (slot, p, d): same call, same Δ."""
    target = np.zeros(mask.shape, dtype=bool)
    grid = target.reshape(delta.shape)
    row = delta[slot]
    ref = row[p, d]
    grid[slot] = np.abs(row - ref) <= rtol * max(1.0, abs(float(ref)))
    target &= mask
    target[(slot * delta.shape[1] + p) * delta.shape[2] + d] = True
    return target


def _batch(policy: Any, demos: Demonstrations, idx: np.ndarray) -> dict[str, Any]:
    dev = policy.device
    return {"obs": {k: th.as_tensor(v[idx], device=dev) for k, v in demos.obs.items()},
            "masks": th.as_tensor(demos.masks[idx], device=dev),
            "targets": th.as_tensor(demos.targets[idx], device=dev),
            "returns": th.as_tensor(demos.returns[idx], device=dev)}


def _log_probs_and_values(policy: Any, obs: dict[str, th.Tensor], masks: th.Tensor,
                          with_values: bool) -> tuple[th.Tensor, th.Tensor | None]:
    """Masked log-probabilities (B, A) and values (B,) of any MaskableActorCriticPolicy."""
    from hexagent_gym.agents.learned import EquivariantPolicy

    if isinstance(policy, EquivariantPolicy):  # one forward for both heads
        emb = policy.net.embed(policy._net_obs(obs))
        logits = policy.net.logits(emb)
        values = policy.net.value(emb).flatten() if with_values else None
    else:
        logits = policy.get_distribution(obs).distribution.logits
        values = policy.predict_values(obs).flatten() if with_values else None
    logits = th.where(masks, logits, th.full_like(logits, -1e8))
    return th.log_softmax(logits, dim=-1), values


def _set_log_prob(log_probs: th.Tensor, targets: th.Tensor) -> th.Tensor:
    """log Σ_{a ∈ targets} π(a): the probability of choosing any teacher-equivalent action."""
    return th.logsumexp(th.where(targets, log_probs, th.full_like(log_probs, -1e9)), dim=-1)


def dagger(policy: Any, env: Any, demos: Demonstrations, *, rounds: int = 2,
           episodes: int = 4, first_seed: int = 21_000, epochs: int = 2, lr: float = 1e-3,
           gamma: float = 0.99, value_coef: float = 0.5, seed: int = 0, teacher: Any = None,
           log: Callable[[int, dict[str, float]], None] | None = None) -> Demonstrations:
    """DAgger rounds after :func:`behaviour_clone`: roll the current policy out greedily, label
    the states it reaches with the teacher, aggregate, refit. Plain cloning sees only the
    teacher's states; one off-teacher pick moves the queues somewhere it never saw, where its
    errors compound (docs/learned.md measures it). Returns the aggregated demonstrations.

    ``teacher`` labels the states (default HexAgent, as in :func:`collect_demonstrations`).
    ``log(round, stats)`` gets ``on_policy_accuracy`` (before refitting) and the last epoch's
    :func:`behaviour_clone` statistics.
    """
    for r in range(rounds):
        seeds = range(first_seed + r * episodes, first_seed + (r + 1) * episodes)
        new = collect_demonstrations(env, seeds, gamma=gamma, learner=_Greedy(policy),
                                     beta=0.0, teacher=teacher)
        acc = imitation_loss(policy, new)["accuracy"]
        demos = Demonstrations.concat([demos, new])
        hist = behaviour_clone(policy, demos, epochs=epochs, lr=lr, value_coef=value_coef,
                               seed=seed + r + 1)
        if log is not None:
            log(r, {"on_policy_accuracy": acc, **hist[-1]})
    return demos


class _Greedy:
    """A policy's masked argmax as a learner for :func:`collect_demonstrations`."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def predict(self, obs: Any, action_masks: Any = None, deterministic: bool = True) -> Any:
        return self.policy.predict(obs, action_masks=action_masks, deterministic=True)


def calibrate_temperature(policy: Any, demos: Demonstrations, target: float = 0.8,
                          iters: int = 30) -> float:
    """Set the equivariant policy's logit scale so that the mean probability it gives to the
    teacher-equivalent actions on ``demos`` is ``target`` (bisection on the log scale; the
    argmax is unchanged). Returns the scale. Cloning drives that probability to ≈ 1, which
    leaves PPO nothing to explore.

    Raises:
        TypeError: the policy has no logit scale (only ``EquivariantPolicy`` has one).
    """
    net = getattr(policy, "net", None)
    if net is None or not hasattr(net, "log_scale"):
        raise TypeError(f"{type(policy).__name__} has no logit scale to calibrate")
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target}")

    def mean_prob(log_scale: float) -> float:
        with th.no_grad():
            net.log_scale.fill_(log_scale)
        return float(np.exp(-imitation_loss(policy, demos)["loss"]))  # geometric mean

    lo, hi = -12.0, float(net.log_scale.detach())
    if mean_prob(hi) <= target:
        return float(np.exp(hi))
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mean_prob(mid) > target:
            hi = mid
        else:
            lo = mid
    mean_prob(hi)
    return float(np.exp(hi))


def imitation_loss(policy: Any, demos: Demonstrations, batch_size: int = 512
                   ) -> dict[str, float]:
    """On ``demos``: ``loss``, the mean −log π(teacher-equivalent action | s, mask);
    ``accuracy``, how often the policy's argmax is teacher-equivalent; ``exact``, how often it
    is the teacher's exact action."""
    policy.set_training_mode(False)
    total, agree, exact = 0.0, 0, 0
    with th.no_grad():
        for start in range(0, len(demos), batch_size):
            idx = np.arange(start, min(start + batch_size, len(demos)))
            b = _batch(policy, demos, idx)
            log_probs, _ = _log_probs_and_values(policy, b["obs"], b["masks"], False)
            total += float(-_set_log_prob(log_probs, b["targets"]).sum())
            choice = log_probs.argmax(dim=-1)
            agree += int(b["targets"].gather(1, choice[:, None]).sum())
            exact += int((choice.numpy() == demos.actions[idx]).sum())
    n = max(len(demos), 1)
    return {"loss": total / n, "accuracy": agree / n, "exact": exact / n}


def behaviour_clone(policy: Any, demos: Demonstrations, *, epochs: int = 5,
                    batch_size: int = 256, lr: float = 1e-3, value_coef: float = 0.5,
                    max_grad_norm: float = 1.0, seed: int = 0, accuracy_samples: int = 2048,
                    log: Callable[[int, dict[str, float]], None] | None = None
                    ) -> list[dict[str, float]]:
    """Fit ``policy`` (a MaskableActorCriticPolicy, e.g. ``model.policy``) to the teacher.

    Loss per batch: −mean log Σ_{a ∈ T(s)} π(a | s, mask) + value_coef · MSE(V(s), return)
    where T(s) are the teacher-equivalent actions (:func:`equivalent_actions`)
    (``value_coef=0`` leaves the critic alone). A fresh Adam optimiser is used, so the PPO
    optimiser's state is untouched.

    Returns:
        Per-epoch statistics: ``loss`` (mean training cross-entropy), ``value_loss``,
        ``accuracy`` (argmax agreement with the teacher after the epoch, on up to
        ``accuracy_samples`` random training samples).
    """
    gen = np.random.default_rng(seed)
    opt = th.optim.Adam(policy.parameters(), lr=lr)
    history = []
    for epoch in range(epochs):
        policy.set_training_mode(True)
        order = gen.permutation(len(demos))
        ce_sum = v_sum = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            b = _batch(policy, demos, idx)
            log_probs, values = _log_probs_and_values(policy, b["obs"], b["masks"],
                                                      value_coef > 0.0)
            ce = -_set_log_prob(log_probs, b["targets"]).mean()
            loss = ce
            v_loss = th.zeros(())
            if values is not None:
                v_loss = nn.functional.mse_loss(values, b["returns"])
                loss = loss + value_coef * v_loss
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
            opt.step()
            ce_sum += ce.item() * len(idx)
            v_sum += v_loss.item() * len(idx)
        n = len(order)
        check = demos.subset(order[:accuracy_samples])
        stats = {"loss": ce_sum / n, "value_loss": v_sum / n,
                 "accuracy": imitation_loss(policy, check)["accuracy"]}
        history.append(stats)
        if log is not None:
            log(epoch, stats)
    policy.set_training_mode(False)
    return history


__all__ = ["Demonstrations", "behaviour_clone", "calibrate_temperature",
           "collect_demonstrations", "dagger",
           "equivalent_actions", "imitation_loss"]
