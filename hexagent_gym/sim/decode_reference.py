"""A per-token reference for one decode instance, to measure the rate model's approximation.

The simulator advances decode batches with a piecewise-constant token rate that changes only when
the batch changes (:class:`~hexagent_gym.planning.entities.DecodeInstance`). This module replays the
same arrivals two ways on one instance: with that class, and token by token (every step re-evaluates
the step time from the batch's exact context, and new calls join at step boundaries, as in
vLLM's continuous batching). ``scripts/decode_reference.py`` prints the comparison for docs/.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexagent_gym.planning.entities import Call, DecodeInstance
from hexagent_gym.workload.workload import CallSpec


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """A call reaching the decode instance at ``arrival`` (s) with its prompt and output lengths."""

    arrival: float
    input_tokens: int
    output_tokens: int


def per_token_finish_times(latency, jobs: list[DecodeJob], capacity: int,
                           max_batch: int) -> list[float]:
    """Finish time of each job when every decode step is simulated (FIFO admission)."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
    finish = [0.0] * len(jobs)
    waiting: list[int] = []
    running: dict[int, int] = {}  # job -> tokens generated
    used = 0
    now = 0.0
    nxt = 0
    while nxt < len(order) or waiting or running:
        while nxt < len(order) and jobs[order[nxt]].arrival <= now:
            waiting.append(order[nxt])
            nxt += 1
        while waiting and len(running) < max_batch:
            j = waiting[0]
            need = jobs[j].input_tokens + jobs[j].output_tokens
            if used + need > capacity:
                break
            waiting.pop(0)
            running[j] = 0
            used += need
        if not running:
            now = max(now, jobs[order[nxt]].arrival)
            continue
        ctx = sum(jobs[j].input_tokens + g for j, g in running.items())
        now += latency.decode_step_time(len(running), ctx)
        for j in list(running):
            running[j] += 1
            if running[j] == jobs[j].output_tokens:
                finish[j] = now
                used -= jobs[j].input_tokens + jobs[j].output_tokens
                del running[j]
    return finish


def rate_model_finish_times(latency, jobs: list[DecodeJob], capacity: int,
                            max_batch: int) -> list[float]:
    """Finish time of each job under the simulator's rate model (same DecodeInstance code)."""
    inst = DecodeInstance(0, "ref", latency, capacity, max_batch)
    calls = [Call(i, None, 0, CallSpec(str(i), (), (), j.input_tokens, j.output_tokens, 0.0),
                  j.output_tokens, 1.0, 1.0) for i, j in enumerate(jobs)]
    arrivals = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
    finish = [0.0] * len(jobs)
    waiting: list[int] = []
    nxt = 0
    next_done = float("inf")
    while nxt < len(arrivals) or waiting or inst.batch:
        t_arr = jobs[arrivals[nxt]].arrival if nxt < len(arrivals) else float("inf")
        if next_done <= t_arr:
            now = next_done
            inst.t_v = now
            done = [inst.finish_head()]
            while inst.batch and inst.batch[0][0] <= inst.v:
                done.append(inst.finish_head())
            for c in done:
                finish[c.uid] = now
        else:
            now = t_arr
            inst.advance(now)
            waiting.append(arrivals[nxt])
            nxt += 1
        admitted = False
        while waiting and len(inst.batch) < max_batch:
            c = calls[waiting[0]]
            if inst.used_kv + c.kv_true > capacity:
                break
            waiting.pop(0)
            inst.admit(c, now)
            admitted = True
        if admitted or not inst.batch or next_done == now:
            next_done = now + inst.rerate()
    return finish


def compare(latency, jobs: list[DecodeJob], capacity: int = 10**9,
            max_batch: int = 256) -> dict[str, float]:
    """Relative error of the rate model's decode durations against the per-token reference."""
    ref = per_token_finish_times(latency, jobs, capacity, max_batch)
    rate = rate_model_finish_times(latency, jobs, capacity, max_batch)
    errs = [abs((r - j.arrival) - (f - j.arrival)) / (f - j.arrival)
            for r, f, j in zip(rate, ref, jobs, strict=True)]
    makespan_ref, makespan_rate = max(ref), max(rate)
    return {
        "mean_rel_error": sum(errs) / len(errs),
        "max_rel_error": max(errs),
        "makespan_rel_error": abs(makespan_rate - makespan_ref) / makespan_ref,
    }


__all__ = ["DecodeJob", "compare", "per_token_finish_times", "rate_model_finish_times"]
