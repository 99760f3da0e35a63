"""The Chrome trace's numbers: each span's ``ts`` and ``ts + dur`` are its start and end rounded
to whole nanoseconds, so spans never overlap on a track and spans that touch in simulated time
touch exactly in the written JSON (compared in exact decimal arithmetic, as written)."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy

# a tiny episode with back-to-back spans on shared tracks (prefill instances and decode queues)
TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=12, load=1.5, seed=0)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    sim = EpisodeFactory(EpisodeConfig(**TINY, record_timeline=True)).simulator()
    tl = run_policy(sim, make_policy("hexagent")).timeline
    path = tl.save_chrome_trace(tmp_path_factory.mktemp("tl") / "trace.json")
    # every number exactly as written: no float arithmetic on ts + dur
    data = json.loads(path.read_text(), parse_float=Decimal, parse_int=Decimal)
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(tl.spans) > 50
    return tl, spans


def ns(t: float) -> Decimal:
    """A simulated time in seconds as the trace writes it: whole ns, in microseconds."""
    return Decimal(round(t * 1e9)) / 1000


def test_ts_and_end_are_the_spans_times_in_whole_nanoseconds(trace):
    tl, events = trace
    for e, s in zip(events, tl.spans, strict=True):
        assert e["ts"] == ns(s.start)
        assert e["ts"] + e["dur"] == ns(s.end)  # dur is derived, not rounded on its own
        assert e["dur"] >= 0 and e["ts"] == e["ts"].quantize(Decimal("0.001"))


def test_no_two_spans_overlap_on_a_track_and_touching_spans_touch_exactly(trace):
    tl, events = trace
    tracks = defaultdict(list)
    for e, s in zip(events, tl.spans, strict=True):
        tracks[(e["pid"], e["tid"])].append((e, s))
    touching = 0
    for pairs in tracks.values():
        pairs.sort(key=lambda p: (p[0]["ts"], p[0]["dur"]))
        for (a, sa), (b, sb) in zip(pairs, pairs[1:], strict=False):
            assert b["ts"] >= a["ts"] + a["dur"], (a, b)
            if sa.end == sb.start:  # back to back in simulated time: no gap, no overlap
                touching += 1
                assert b["ts"] == a["ts"] + a["dur"], (a, b)
    assert touching >= 2  # the episode exercises the case separate rounding got wrong
