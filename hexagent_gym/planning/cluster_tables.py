"""Per-cluster constants of the hot path: prefill and transfer times by prompt length, decode
step-time tables by batch size, instance classes (docs/architecture.md).

Instances of one *class* (one latency model: GPU × TP) share speeds and network rows, so much
per-call work runs per class instead of per instance.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.planning import kernels

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hexagent_gym.cluster.cluster import ClusterSpec

INF = float("inf")


def mean_own_context(l_in, l_out):
    """A call's own mean context over its decode, ``L_in + (L̂_out − 1)/2`` tokens (scalars or
    arrays; the one place this term of the projections is written)."""
    return l_in + 0.5 * (l_out - 1.0)


_KEPT_INF_GRIDS = 32  # largest window whose inf Δ array inf_grid keeps
_ALONE_CACHE_SIZE = 1 << 17  # standalone estimates alone_estimate keeps (about 20 MB)
_XCOL_CACHE_FLOATS = 1 << 21  # transfer-column floats ClusterTables keeps (at most ≈ 64 MB)
_SLOPE_SPAN = 8192.0  # context tokens over which the per-token slope of step time is measured


class ClusterTables:
    """Per-cluster constants for the hot path, shared by every episode on that cluster."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.num_prefill = len(cluster.prefill)
        self.num_decode = len(cluster.decode)
        self.setup = np.asarray(cluster.transfer_setup_s, dtype=np.float64)
        self.s_per_token = np.asarray(cluster.transfer_s_per_token, dtype=np.float64)
        self.setup_list = self.setup.tolist()
        self.spt_list = self.s_per_token.tolist()
        self.capacity = np.array([d.kv_capacity_tokens for d in cluster.decode], dtype=np.float64)
        self.max_batch = np.array([d.max_batch_size for d in cluster.decode], dtype=np.int64)
        # Distinct latency models ("classes") so per-call work is per class, not per instance.
        self.pf_models, self.pf_class = _classes([p.latency for p in cluster.prefill])
        self.dec_models, self.dec_class = _classes([d.latency for d in cluster.decode])
        self._pf_cache: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        self._pf_hit_cache: dict[tuple[int, int], tuple[float, ...]] = {}
        self._alone_pf_cache: dict[tuple[int, int], tuple[float, ...]] = {}
        self.pf_class_list = self.pf_class.tolist()
        # per-class values -> the tuple per prefill instance, in C (an O(P) comprehension per
        # revealed call was a sixth of a call's bytecodes at 64 prefill instances); picklable,
        # and with one instance a one-item slice, so still a tuple
        cls = self.pf_class_list
        self.per_instance = (operator.itemgetter(*cls) if len(cls) > 1
                             else operator.itemgetter(slice(cls[0], cls[0] + 1)))
        self._pool_cache: dict[tuple[int, int], float] = {}
        self._alone_cache: dict[tuple[int, int, float], float] = {}
        # prefill instances of one class share speed and network rows: the placement rule only
        # needs the least-loaded member of each class
        self.pf_members = [[p for p, k in enumerate(self.pf_class.tolist()) if k == c]
                           for c in range(len(self.pf_models))]
        self.pf_rep = [m[0] for m in self.pf_members]
        # per class, a getter of its members' entries from a per-instance list (a one-member
        # class repeats its index so the getter still returns a tuple)
        self.pf_member_values = [operator.itemgetter(*m, *m[:1]) for m in self.pf_members]
        # class-contiguous order of prefill instances, for one reduceat over each class
        self.pf_perm = np.array([p for m in self.pf_members for p in m], dtype=np.int64)
        self.pf_starts = np.cumsum([0] + [len(m) for m in self.pf_members[:-1]])
        self.setup_cls = self.setup[self.pf_rep]  # (K, D): a class's members share these rows
        self.spt_cls = self.s_per_token[self.pf_rep]
        self._class_sizes = [len(m) for m in self.pf_members]
        self._xcol_cache: dict[int, tuple[tuple[float, ...], ...]] = {}
        self._inf_grids: dict[int, np.ndarray] = {}
        self._xcol_cache_size = max(256, _XCOL_CACHE_FLOATS // (self.num_decode
                                                               * len(self.pf_models)))
        width = int(self.max_batch.max()) + 2
        base = np.zeros((len(self.dec_models), width))
        slope = np.zeros((len(self.dec_models), width))
        for k, lm in enumerate(self.dec_models):
            for b in range(1, width):
                t0 = lm.decode_step_time(b, 0)
                base[k, b] = t0
                slope[k, b] = (lm.decode_step_time(b, _SLOPE_SPAN * b) - t0) / (_SLOPE_SPAN * b)
        self.dec_base = base[self.dec_class]  # (D, width): step time of a batch of b, no context
        self.dec_slope = slope[self.dec_class]  # (D, width): seconds per context token
        self.dec_base_list = self.dec_base.tolist()
        self.dec_slope_list = self.dec_slope.tolist()
        self.batch_top = width - 1  # decode tables are clamped at this batch size
        self.dec_capacity = self.capacity.tolist()
        self.max_batch_list = self.max_batch.tolist()
        self.dec_static = list(zip(self.capacity.tolist(), self.max_batch.tolist(),
                                   self.dec_base_list, self.dec_slope_list, strict=True))
        # decode instances that no projection can tell apart when idle (placement.decode_scan)
        kinds: dict[tuple, int] = {}
        self.dec_kind = [kinds.setdefault((int(self.dec_class[d]), self.dec_static[d][:2],
                                           tuple(self.setup[:, d].tolist()),
                                           tuple(self.s_per_token[:, d].tolist())), len(kinds))
                         for d in range(self.num_decode)]
        self._d_range = np.arange(self.num_decode)
        # one representative per class pair for standalone estimates: (p, setup row, s/token row)
        dec_rep = [self.dec_class.tolist().index(k) for k in range(len(self.dec_models))]
        self._alone_dec = [(float(base[k, 1]), float(slope[k, 1])) for k in range(len(dec_rep))]
        self._alone_pairs = [(p, self.setup[p, dec_rep].tolist(),
                              self.s_per_token[p, dec_rep].tolist()) for p in self.pf_rep]
        # the same terms flat, as the compiled standalone_estimate reads them
        self._alone_terms = (tuple(b for b, _ in self._alone_dec),
                             tuple(s for _, s in self._alone_dec), tuple(self.pf_rep),
                             tuple(x for _, row, _ in self._alone_pairs for x in row),
                             tuple(x for _, _, row in self._alone_pairs for x in row))
        # a prompt's transfer seconds per (decode instance, prefill class): setup + L · s/token
        self._xcol_setup = self.setup_cls.T.copy()  # (D, K)
        self._xcol_spt = self.spt_cls.T.copy()
        # the same two tables as the compiled kernels read them (setup, then s/token, each D·K
        # float64 values, decode-instance-major, in one bytes object): given a call's prompt
        # length, they compute its transfer seconds with _transfer_seconds' two operations per
        # entry, reading two small hot tables instead of a cached block per prompt length
        self.transfer_tables = self._xcol_setup.tobytes() + self._xcol_spt.tobytes()

    def prefill_times(self, input_tokens: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """True prefill seconds of a prompt per prefill instance and per prefill class, cached.

        The cached values here are tuples of floats: CPython's garbage collector stops
        tracking those, so the thousands of entries a trace fills do not slow every full
        collection (lists of floats stay tracked; they cost about 30 ms per full collection
        on hetero-1)."""
        hit = self._pf_cache.get(input_tokens)
        if hit is None:
            per_class = tuple(lm.prefill_time(input_tokens) for lm in self.pf_models)
            hit = (self.per_instance(per_class), per_class)
            self._pf_cache[input_tokens] = hit
        return hit

    def alone_prefill(self, input_tokens: int, own: int) -> tuple[float, ...]:
        """True prefill seconds per prefill instance of a prompt alone on the cluster, with its
        own workflow's ``own`` earlier prompt tokens hit (a call's ``pf_true``)."""
        if not own:
            return self.prefill_times(input_tokens)[0]
        key = (input_tokens, own)
        hit = self._alone_pf_cache.get(key)  # shared, as prefill_times' tuples: a fresh P-tuple
        if hit is None:  # per revealed call kept the garbage collector busy at large clusters
            hit = self._alone_pf_cache[key] = self.per_instance(
                self.prefill_times_hit(input_tokens, own))
        return hit

    def alone_estimate(self, alone: Sequence[float], input_tokens: int, own: int,
                       output_tokens: float) -> float:
        """:meth:`standalone_estimate` of a call without estimation errors, whose error-free
        prefill alone is ``alone`` (= :meth:`alone_prefill` of ``input_tokens`` and ``own``:
        the caller's contract, read only on a miss), cached by the three numbers: the engine
        asks it for every call twice (on reveal with the predicted output, on completion with
        the true one), and a trace repeats its lengths."""
        cache = self._alone_cache
        key = (input_tokens, own, output_tokens)
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _ALONE_CACHE_SIZE:  # predicted lengths may never repeat: bounded
                cache.clear()
            hit = cache[key] = self.standalone_estimate(alone, input_tokens, output_tokens, 1.0)
        return hit

    def prefill_times_hit(self, input_tokens: int, cached: int) -> tuple[float, ...]:
        """True prefill seconds per prefill *class* when ``cached`` prompt tokens hit, cached."""
        if cached <= 0:
            return self.prefill_times(input_tokens)[1]
        key = (input_tokens, cached)
        hit = self._pf_hit_cache.get(key)
        if hit is None:
            hit = tuple(lm.prefill_time(input_tokens, cached) for lm in self.pf_models)
            self._pf_hit_cache[key] = hit
        return hit

    def pool_seconds(self, input_tokens: int, cached: int) -> float:
        """Prefill-pool seconds of one prompt with ``cached`` tokens hit: its prefill with every
        instance working on it in parallel at its own speed (``hexagent_gym.sim.load``), cached."""
        key = (input_tokens, cached)
        hit = self._pool_cache.get(key)
        if hit is None:
            per_class = self.prefill_times_hit(input_tokens, cached)
            hit = 1.0 / sum(n / t for n, t in zip(self._class_sizes, per_class, strict=True))
            self._pool_cache[key] = hit
        return hit

    def inf_grid(self, n: int) -> np.ndarray:
        """A fresh float64 (n, P, D) array of inf (a window's Δ before its entries are set):
        for windows up to 32 calls a copy of a kept one, cheaper than ``np.full`` at these
        sizes (the kept arrays stay bounded however long the windows get)."""
        kept = self._inf_grids.get(n)
        if kept is None:
            kept = np.full((n, self.num_prefill, self.num_decode), np.inf)
            if n > _KEPT_INF_GRIDS:
                return kept
            self._inf_grids[n] = kept
        return kept.copy()

    def transfer_cols(self, input_tokens: int) -> tuple[tuple[float, ...], ...]:
        """KV-transfer seconds per (decode instance, prefill class) of a prompt, cached (tuples,
        untracked by the garbage collector like :meth:`prefill_times`'s).

        The cache holds at most about 2 M floats: an entry holds D·K of them and a trace has
        thousands of prompt lengths (about 10 kB per length at 64 decode instances and 3 prefill
        classes, so unbounded it would grow without limit with the cluster). When full it is
        emptied: hits matter for the calls decisions re-plan, which are recent ones."""
        cache = self._xcol_cache
        hit = cache.get(input_tokens)
        if hit is None:
            if len(cache) >= self._xcol_cache_size:
                cache.clear()
            hit = cache[input_tokens] = tuple(map(tuple, self._transfer_seconds(
                input_tokens).tolist()))
        return hit

    def _transfer_seconds(self, input_tokens: int) -> np.ndarray:
        """(D, K) float64, C order: a prompt's KV-transfer seconds per (decode instance, prefill
        class). numpy's elementwise multiply then add: the same two IEEE operations per entry
        as the scalar ``setup[p][d] + L * spt[p][d]``."""
        return self._xcol_setup + input_tokens * self._xcol_spt

    def decode_tau(self, count: np.ndarray, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-token step time (base, per-context-token slope) of each decode instance when one
        more call joins ``count`` committed calls holding ``ctx`` context tokens."""
        b = np.minimum(count + 1, self.dec_base.shape[1] - 1)
        slope = self.dec_slope[self._d_range, b]
        return self.dec_base[self._d_range, b] + slope * ctx, slope

    def standalone_estimate(self, pf_est: Sequence[float], l_in: int, l_out: float,
                            dec_err: float) -> float:
        """A call's duration alone on the empty cluster at its best pair (scheduler-visible).

        Instances of one class share every term, so the minimum runs over class pairs. Runs the
        compiled twin when it is built (:meth:`standalone_estimate_python` is the reference)."""
        kernel = kernels.standalone_estimate
        if kernel is not None:
            return kernel(pf_est, l_in, l_out, dec_err, *self._alone_terms)
        return self.standalone_estimate_python(pf_est, l_in, l_out, dec_err)

    def standalone_estimate_python(self, pf_est: Sequence[float], l_in: int, l_out: float,
                                   dec_err: float) -> float:
        """:meth:`standalone_estimate` in pure Python."""
        ctx = mean_own_context(l_in, l_out)
        dec = [l_out * (b + s * ctx) * dec_err for b, s in self._alone_dec]
        best = INF
        for p, setup, spt in self._alone_pairs:
            pf = pf_est[p]
            for j, x in enumerate(dec):
                v = pf + setup[j] + l_in * spt[j] + x
                if v < best:
                    best = v
        return best


def _classes(models: list) -> tuple[list, np.ndarray]:
    distinct: list = []
    index = []
    for m in models:
        for k, known in enumerate(distinct):
            if known is m:
                index.append(k)
                break
        else:
            index.append(len(distinct))
            distinct.append(m)
    return distinct, np.array(index, dtype=np.int64)
