"""The scheduler-visible state and the decision seam: calls, workflows and instances with
their scheduler-visible loads (``entities``), per-cluster constants, the planner's
simulated state Ŝ (``plan_state``), the projections Δ, the fallback's placement rule,
``DecisionPoint``, and the optional compiled kernels (``_kernels.c``, dispatched by
``kernels``). Imports ``config``, ``workload`` and ``cluster``; never the engine.
"""
