"""The env under instance faults (docs/faults.md): its action mask never offers an unavailable
instance, observations stay finite, and an episode of masked random actions ends."""

from __future__ import annotations

import numpy as np

from hexagent_gym.envs.pd_cluster_env import PDClusterEnv

FAULTS = {"mtbf": 1.0, "mttr": 0.5, "kinds": ["fail", "drain", "slow"]}


def test_the_mask_leaves_out_unavailable_instances():
    env = PDClusterEnv({"cluster": "tiny-2p2d", "trace": "bfcl_v3", "num_workflows": 10,
                        "load": 1.0, "faults": FAULTS})
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=2)
    done, seen_down = False, 0
    while not done:
        mask = env.action_masks()
        flow = env.simulator._faults
        dp = env.simulator._pending
        if flow is not None and dp is not None and (flow.down_p or flow.down_d):
            seen_down += 1
            for a in np.flatnonzero(mask):
                slot, p, d = env.decode_action(int(a))
                if dp.stage == 0:
                    assert p not in flow.down_p and d not in flow.down_d
                else:  # a call already at a drained instance stays there; none moves to one
                    assert d not in flow.down_d or d == dp.calls[slot].decode_inst
        for value in obs.values():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                assert np.isfinite(value).all()
        obs, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        done = term or trunc
    assert seen_down > 0
