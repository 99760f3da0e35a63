"""The discrete-event simulation: the event heap, the engine (clock, arrivals, reveals,
completions), the flows of prefill, KV transfer, decode and scheduling invocations,
prefix caches, standalone horizons H_w, ``Simulator``, forks, timelines and the
metrics (slo ratio, Req95/Req99, offered load). May import every folder below it;
nothing below imports it.
"""
