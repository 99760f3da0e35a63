"""CleanRL-style single-file PPO with invalid-action masking on PDCluster-v0.

Usage:
    python scripts/ppo_masked.py --total-timesteps 20000 --num-workflows 20 --logdir runs
    tensorboard --logdir runs

After CleanRL's ppo.py: a SyncVectorEnv in SAME_STEP autoreset mode whose observations carry the
mask (``action_mask_in_obs=True``), an MLP over the concatenated float boxes, a Categorical with
invalid logits set to -1e8, GAE, the clipped PPO loss. Under SAME_STEP the step that ends an
episode already returns the next episode's first observation, so GAE is cut there (done =
terminated | truncated); a truncation is bootstrapped with V(info["final_obs"]), a termination
with 0. TensorBoard (<logdir>/<run>): charts/{req99, episodic_return, episodic_length,
learning_rate, SPS}, losses/*, eval/{req99, hexagent_req99} (the mean over --eval-seeds, at the
final global step). Every scalar's step is the global env step (env steps summed over the
sub-envs). Prints each finished episode's Req99 (from info["final_info"]) and at the end the
greedy policy's Req99 next to HexAgent's (env.rollout).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch.utils.tensorboard import SummaryWriter

from hexagent_gym.envs import make_env_fn

MASKED_LOGIT = -1e8  # finite, so an all-invalid row stays a (uniform) distribution, never NaN


@dataclass
class Args:
    seed: int = 1  # python, numpy, torch and the vector env (sub-env i resets with seed + i)
    logdir: str = "runs"
    torch_threads: int = 0  # 0: torch's default
    # the episodes (any hexagent_gym.make key can be added the same way)
    cluster: str = "hetero-1"
    trace: str = "bfcl_v3"
    num_workflows: int = 20
    max_calls_per_decision: int = 16
    max_steps: int = 0  # truncate episodes after this many steps (0: when the trace drains)
    # the algorithm
    total_timesteps: int = 20000
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    num_envs: int = 4
    num_steps: int = 128  # steps per env per rollout
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 256
    eval_seeds: str = "0,1"  # reset seeds of the final evaluation ('' to skip it)


def parse_args(argv: list[str] | None = None) -> Args:
    """Args from a command line: one ``--flag-name`` per field (booleans take true/false)."""
    kinds = {"int": int, "float": float, "str": str,
             "bool": lambda s: s.lower() in ("1", "true", "yes")}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Args):
        p.add_argument("--" + f.name.replace("_", "-"), type=kinds[f.type], default=f.default,
                       help=" ")
    return Args(**vars(p.parse_args(argv)))


def make_env(args: Args, rank: int):
    """Thunk for sub-env ``rank``: the mask travels inside the observation."""
    return make_env_fn(cluster=args.cluster, trace=args.trace, num_workflows=args.num_workflows,
                       max_calls_per_decision=args.max_calls_per_decision, seed=args.seed,
                       max_steps=args.max_steps or None, rank=rank, action_mask_in_obs=True)


def flatten(obs: dict, keys: tuple[str, ...], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features float32 [batch, F], mask bool [batch, A]) from a (batched) Dict observation."""
    x = np.concatenate([np.asarray(obs[k], np.float32).reshape(batch, -1) for k in keys], axis=1)
    return torch.from_numpy(x), torch.from_numpy(np.asarray(obs["action_mask"]).reshape(batch, -1)
                                                 .astype(bool))


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(inputs: int, hidden: int, outputs: int, std: float) -> nn.Sequential:
    return nn.Sequential(layer_init(nn.Linear(inputs, hidden)), nn.Tanh(),
                         layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
                         layer_init(nn.Linear(hidden, outputs), std=std))


class Agent(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int, hidden: int, keys: tuple[str, ...]):
        super().__init__()
        self.keys = keys  # observation keys in the order they are concatenated
        self.critic = mlp(obs_dim, hidden, 1, std=1.0)
        self.actor = mlp(obs_dim, hidden, num_actions, std=0.01)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def masked_logits(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, self.actor(x), torch.tensor(MASKED_LOGIT))

    def get_action_and_value(self, x, mask, action=None):
        probs = torch.distributions.Categorical(logits=self.masked_logits(x, mask))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)

    def predict(self, obs, state=None, episode_start=None, deterministic=True, action_masks=None):
        """SB3-style ``predict`` on one env's observation (greedy by default), so that
        ``env.rollout(agent)`` runs it (the mask comes from ``obs["action_mask"]``)."""
        with torch.no_grad():
            logits = self.masked_logits(*flatten(obs, self.keys, 1))
            a = logits.argmax(1) if deterministic else \
                torch.distributions.Categorical(logits=logits).sample()
        return int(a.item()), state


def train(args: Args) -> dict:
    """Run PPO; returns {"updates", "global_step", "episode_req99" (list), "eval_req99",
    "hexagent_req99", "run_dir"}. An invalid action would raise ValueError in the env."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    if num_iterations < 1 or minibatch_size < 1:
        raise ValueError(f"nothing to train: total_timesteps={args.total_timesteps} must be >= "
                         f"num_envs x num_steps = {batch_size} >= num_minibatches")
    run_name = f"ppo_masked__{args.cluster}__{args.seed}__{int(time.time())}"
    writer = SummaryWriter(f"{args.logdir}/{run_name}")
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{k}|{v}|" for k, v in vars(args).items()))
    random.seed(args.seed)  # seeding: everything from args.seed
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    envs = SyncVectorEnv([make_env(args, i) for i in range(args.num_envs)],
                         autoreset_mode=AutoresetMode.SAME_STEP)
    keys = tuple(k for k in envs.single_observation_space.spaces if k != "action_mask")
    num_actions = int(envs.single_action_space.n)
    obs_dim = sum(int(np.prod(envs.single_observation_space[k].shape)) for k in keys)
    agent = Agent(obs_dim, num_actions, args.hidden, keys)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # rollout buffer
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim))
    masks = torch.zeros((args.num_steps, args.num_envs, num_actions), dtype=torch.bool)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))  # 1: the episode ended at this step
    values = torch.zeros((args.num_steps, args.num_envs))

    global_step, start, updates, ep_req99 = 0, time.time(), 0, []
    ep_len = np.zeros(args.num_envs, dtype=int)
    next_obs, _ = envs.reset(seed=args.seed)
    next_x, next_mask = flatten(next_obs, keys, args.num_envs)
    for iteration in range(1, num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step], masks[step] = next_x, next_mask
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_x, next_mask)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            next_obs, reward, terminated, truncated, infos = envs.step(action.numpy())
            reward = np.array(reward, dtype=np.float32)  # a copy: bootstrapping edits it
            ep_len += 1
            # SAME_STEP: next_obs of an ended sub-env is already its next episode's first obs
            for i in np.flatnonzero(truncated & ~terminated):
                with torch.no_grad():  # a cut, not an outcome: bootstrap from the final obs
                    final_x, _ = flatten(infos["final_obs"][i], keys, 1)
                    reward[i] += args.gamma * agent.get_value(final_x).item()
            rewards[step] = torch.from_numpy(reward)
            dones[step] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            next_x, next_mask = flatten(next_obs, keys, args.num_envs)
            final = infos.get("final_info", {})  # the ended episodes' last info, masked by _key
            for i in np.flatnonzero(final.get("_req99", [])):
                ep = {"req99": float(final["req99"][i]), "episodic_length": int(ep_len[i]),
                      "episodic_return": float(final["episode_return"][i])}
                print(f"global_step={global_step}, env {i}: "
                      + ", ".join(f"{k}={v:.4g}" for k, v in ep.items()))
                for tag, value in ep.items():
                    writer.add_scalar(f"charts/{tag}", value, global_step)
                ep_req99.append(ep["req99"])
            ep_len[terminated | truncated] = 0

        # GAE: advantages stop at episode ends (dones[t] = the episode ended at step t)
        with torch.no_grad():
            next_value = agent.get_value(next_x).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                nextnonterminal = 1.0 - dones[t]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        b_obs, b_masks = obs.reshape(batch_size, obs_dim), masks.reshape(batch_size, num_actions)
        b_actions, b_logprobs = actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns, b_values = (advantages.reshape(-1), returns.reshape(-1),
                                             values.reshape(-1))

        # the clipped PPO update
        b_inds = np.arange(batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for begin in range(0, batch_size, minibatch_size):
                mb = b_inds[begin:begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb], b_masks[mb], b_actions[mb])
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(
                    ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                newvalue = newvalue.view(-1)  # clipped value loss
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb],
                                                       -args.clip_coef, args.clip_coef)
                v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2,
                                         (v_clipped - b_returns[mb]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        updates += 1

        y_pred, y_true = b_values.numpy(), b_returns.numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
        sps = int(global_step / (time.time() - start))
        for tag, value in {
                "charts/learning_rate": optimizer.param_groups[0]["lr"], "charts/SPS": sps,
                "losses/value_loss": v_loss.item(), "losses/policy_loss": pg_loss.item(),
                "losses/entropy": entropy_loss.item(), "losses/approx_kl": approx_kl.item(),
                "losses/old_approx_kl": old_approx_kl.item(), "losses/clipfrac": np.mean(clipfracs),
                "losses/explained_variance": explained_var}.items():
            writer.add_scalar(tag, value, global_step)
        print(f"update {iteration}/{num_iterations}: SPS {sps}, value loss {v_loss.item():.4f}")
    envs.close()

    # evaluate the greedy policy through env.rollout, next to HexAgent on the same episodes
    seeds = [int(s) for s in args.eval_seeds.split(",") if s.strip()]
    eval_env = make_env(args, 0)()
    ours = [eval_env.rollout(agent, seed=s).req99 for s in seeds]
    ref = [eval_env.rollout("hexagent", seed=s).req99 for s in seeds]
    for s, a, b in zip(seeds, ours, ref, strict=True):
        print(f"eval seed {s}: req99 {a:.3f} (hexagent {b:.3f})")
    if seeds:
        # at the global env step like every other scalar (the x of the training curves), as
        # the mean over the seeds: one point per run, comparable across runs
        writer.add_scalar("eval/req99", float(np.mean(ours)), global_step)
        writer.add_scalar("eval/hexagent_req99", float(np.mean(ref)), global_step)
    writer.close()
    if ep_req99:
        print(f"training episodes: {len(ep_req99)}, mean req99 {np.mean(ep_req99):.3f}")
    return {"updates": updates, "global_step": global_step, "episode_req99": ep_req99,
            "eval_req99": ours, "hexagent_req99": ref, "run_dir": f"{args.logdir}/{run_name}"}


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
