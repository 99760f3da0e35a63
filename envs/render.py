"""Per-step ``info`` scalars and the ``ansi`` render of PDClusterEnv.

Both read the live simulator only (no projections): the info is built once each time the
simulator advances, because picks inside a decision point move no simulated time, and the render
is built on demand.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hexagent_gym.planning.decisions import Stage

if TYPE_CHECKING:
    from hexagent_gym.planning.decisions import DecisionPoint
    from hexagent_gym.sim.simulator import Simulator

# Enum members as module constants: CPython 3.11 reads `Stage.X` through EnumType's slow
# attribute hook (about 80 ns each), and these run several times per env step.
_STAGE_DECODE = Stage.DECODE
_STAGE_PREFILL = Stage.PREFILL

STEP_INFO_SCALARS = ("sim_time", "waiting_prefill", "waiting_decode", "running_prefill",
                     "running_decode", "workflows_arrived", "workflows_finished")
"""The scalar keys of every step's info, built by :func:`step_info` from the simulator."""

STEP_INFO_KEYS = (*STEP_INFO_SCALARS, "action_mask")
"""Keys of every step's (and reset's) ``info``: the scalars and the step's ``action_mask`` (a
fresh bool array of the env's action-mask length, added by the env); the same set on every step,
so vector envs batch them without ``_key`` holes."""

_WINDOW_ROWS = 8  # calls listed by the render (the rest are counted)


def step_info(sim: Simulator, running: tuple[int, int] | None = None) -> dict[str, Any]:
    """The cheap per-step scalars of ``info`` (:data:`STEP_INFO_SCALARS`) for the simulator now.

    ``running_prefill`` counts prefills in progress (one per busy instance), ``running_decode``
    the calls in decode batches (a sample group counts once); waiting counts include calls beyond
    the decision window. ``running``: those two counts when the caller has just read them
    (``Encoder.begin`` does), else they are counted here.
    """
    if running is None:
        running = (sum(inst.running is not None for inst in sim.prefill),
                   sum(len(inst.batch) for inst in sim.decode))
    return {
        "sim_time": float(sim.now),
        "waiting_prefill": sim.num_waiting(_STAGE_PREFILL),
        "waiting_decode": sim.num_waiting(_STAGE_DECODE),
        "running_prefill": running[0],
        "running_decode": running[1],
        "workflows_arrived": len(sim.workflows),
        "workflows_finished": len(sim.finished),
    }


def _seconds(x: float) -> str:
    return "never" if not math.isfinite(x) else f"{x:7.2f}s"


def render_ansi(sim: Simulator | None, dp: DecisionPoint | None, num_workflows: int,
                steps: int) -> str:
    """One screen of text: clock and counters, the open window (each call's best projected
    completion Δ and HexAgent's risk), then every instance with its queue, Ŝ and KV.

    ``sim`` is the env's simulator (None before the first reset), ``dp`` its open decision point
    (None once the episode drained), ``steps`` the env steps taken this episode."""
    if sim is None:
        return "PDClusterEnv: not started (call reset())\n"
    info = step_info(sim)
    lines = [
        f"t={info['sim_time']:.2f}s  workflows {info['workflows_finished']}/"
        f"{info['workflows_arrived']} finished/arrived of {num_workflows}  "
        f"waiting P{info['waiting_prefill']} D{info['waiting_decode']}  "
        f"running P{info['running_prefill']} D{info['running_decode']}  step {steps}",
    ]
    if dp is None:
        lines.append("episode drained: no decision open")
    else:
        stage = "prefill" if dp.stage == _STAGE_PREFILL else "decode"
        lines.append(f"decision at the {stage} stage: {len(dp.calls)} calls, "
                     f"{len(dp.plan)} picked")
        best = dp.min_delta
        for slot, call in enumerate(dp.calls[:_WINDOW_ROWS]):
            wf = call.workflow
            if dp.picked[slot]:
                tail = "picked"
            else:
                age = dp.now - wf.arrival
                risk = (age + best[slot]) / wf.h_est if wf.h_est > 0 else float("inf")
                tail = f"best Δ {_seconds(float(best[slot]))}  risk {risk:5.2f}"
            lines.append(f"  [{slot:2d}] wf {wf.spec.workflow_id} call {call.index:<3d} "
                         f"in {call.l_in:6d} out~{call.l_out_pred:5d}  {tail}")
        if len(dp.calls) > _WINDOW_ROWS:
            lines.append(f"  ... {len(dp.calls) - _WINDOW_ROWS} more calls in the window")
    state = dp.state if dp is not None else None
    free = state.free if state is not None else None
    lines.append("prefill:")
    for i, inst in enumerate(sim.prefill):
        busy = "busy" if inst.running is not None else "idle"
        plan = f"  Ŝ free in {_seconds(float(free[i] - dp.now))}" if free is not None else ""
        lines.append(f"  P{i:<3d} {inst.gpu:5s} {busy}  queue {len(inst.queue):3d}{plan}")
    lines.append("decode:")
    for inst in sim.decode:
        kv = inst.used_kv / inst.capacity
        bar = "#" * int(round(10 * min(kv, 1.0)))
        lines.append(f"  D{inst.index:<3d} {inst.gpu:5s} batch {len(inst.batch):3d}/"
                     f"{inst.max_batch:<4d} KV [{bar:10s}] {kv:5.1%}  waiting "
                     f"{len(inst.waiting):3d}")
    return "\n".join(lines) + "\n"


__all__ = ["STEP_INFO_KEYS", "STEP_INFO_SCALARS", "render_ansi", "step_info"]
