/* Compiled twins of the decision seam's scalar placement rules (hexagent_gym/planning/kernels.py).
 *
 * Each function here performs, operation for operation and in the same order, the IEEE double
 * arithmetic of a pure-Python function of the core, and returns the same objects: the floats
 * are bit-identical as long as the compiler neither fuses a multiply and an add (built with
 * -ffp-contract=off) nor reassociates (no -ffast-math). The Python functions stay the reference;
 * tests compare the two on every pick of real episodes. The module is an optional build: without
 * a C compiler the package installs and runs the Python versions (hexagent_gym.planning.kernels).
 *
 * Sequences may be lists or tuples (the core hands over both); numbers may be floats or ints.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <numpy/arrayobject.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline PyObject *at(PyObject *seq, Py_ssize_t i) {
    /* a borrowed item of a list or tuple, bounds unchecked (the caller checked the sizes) */
    return PyList_CheckExact(seq) ? PyList_GET_ITEM(seq, i) : PyTuple_GET_ITEM(seq, i);
}

static inline double num(PyObject *o) {
    return PyFloat_CheckExact(o) ? PyFloat_AS_DOUBLE(o) : PyFloat_AsDouble(o);
}

static inline double dat(PyObject *seq, Py_ssize_t i) { return num(at(seq, i)); }

/* PyLong_AsSsize_t, reading an exact int of at most one digit directly: the counts and
 * indices the kernels read per instance are such ints, and the API call costs several times
 * the read. */
static inline Py_ssize_t as_ssize(PyObject *o) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(o) && PyUnstable_Long_IsCompact((PyLongObject *)o))
        return PyUnstable_Long_CompactValue((PyLongObject *)o);
#else
    if (PyLong_CheckExact(o)) {
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0) return 0;
        if (size == 1) return (Py_ssize_t)((PyLongObject *)o)->ob_digit[0];
        if (size == -1) return -(Py_ssize_t)((PyLongObject *)o)->ob_digit[0];
    }
#endif
    return PyLong_AsSsize_t(o);
}

static inline Py_ssize_t iat(PyObject *seq, Py_ssize_t i) { return as_ssize(at(seq, i)); }

static int is_seq(PyObject *o, const char *name) {
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) return 1;
    PyErr_Format(PyExc_TypeError, "%s must be a list or tuple, got %s",
                 name, Py_TYPE(o)->tp_name);
    return 0;
}

/* Whether a kernel got its number of arguments; else a TypeError naming it. */
static int arity(Py_ssize_t nargs, Py_ssize_t want, const char *fn) {
    if (nargs == want) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", fn, want, nargs);
    return 0;
}

/* The arguments of a kernel over four per-decode-instance lists: exactly four lists or tuples
 * (named names) of one length, set in *D; -1 with a TypeError or ValueError naming fn. */
static int four_lists(PyObject *const *args, Py_ssize_t nargs, const char *fn,
                      const char *const names[4], Py_ssize_t *D) {
    if (!arity(nargs, 4, fn)) return -1;
    for (int j = 0; j < 4; j++)
        if (!is_seq(args[j], names[j])) return -1;
    *D = Py_SIZE(args[0]);
    for (int j = 1; j < 4; j++)
        if (Py_SIZE(args[j]) != *D) {
            PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes", fn);
            return -1;
        }
    return 0;
}

/* Every prefill class's members, flattened: mem[mem_start[k]:mem_start[k + 1]] are class k's
 * instances (each in [0, P), the classes splitting the P instances); -1 with a ValueError. */
static int read_members(PyObject *members, Py_ssize_t P, const char *fn, Py_ssize_t *mem,
                        Py_ssize_t *mem_start) {
    Py_ssize_t K = Py_SIZE(members), nm = 0;
    for (Py_ssize_t k = 0; k < K; k++) {
        PyObject *m = at(members, k);
        if (!is_seq(m, "pf_members[k]")) return -1;
        if (Py_SIZE(m) < 1 || nm + Py_SIZE(m) > P) {
            PyErr_Format(PyExc_ValueError, "%s: pf_members must split the prefill instances", fn);
            return -1;
        }
        mem_start[k] = nm;
        for (Py_ssize_t j = 0; j < Py_SIZE(m); j++) {
            Py_ssize_t p = iat(m, j);
            if (p < 0 || p >= P) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "%s: member %zd out of range", fn, p);
                return -1;
            }
            mem[nm++] = p;
        }
    }
    mem_start[K] = nm;
    return 0;
}

/* A decode instance's call-independent terms of decode_terms: with n committed calls the step
 * table's column b = min(n + 1, top), *bc = base[b] + slope[b] * ctx and *sl = slope[b]. row is
 * the instance's (capacity, max_batch, base_row, slope_row). */
static int row_terms(PyObject *row, Py_ssize_t n, Py_ssize_t top, double ctx, double *bc,
                     double *sl) {
    Py_ssize_t b = n < top ? n + 1 : top;
    double slope = dat(at(row, 3), b);
    *bc = dat(at(row, 2), b) + slope * ctx;
    *sl = slope;
    return PyErr_Occurred() ? -1 : 0;
}

/* placement.decode_terms from a decode instance's terms (row_terms; cap and room = cap - its
 * committed tokens; n committed calls of at most max_batch) for a call of decode weight, own
 * context and KV demand kv: *end = weight * (bc + sl * own_ctx) - now, *start = now unless a
 * limit binds, then slow_start(d, need, over). Returns 0; 1 when a limit binds and slow_start is
 * NULL (the caller does not model it); -1 with an exception. */
static int start_end(double now, double bc, double sl, double cap, double room, Py_ssize_t n,
                     Py_ssize_t max_batch, double weight, double own_ctx, double kv,
                     int free_start, PyObject *slow_start, Py_ssize_t d, double *start,
                     double *end) {
    *end = weight * (bc + sl * own_ctx) - now;
    *start = now;
    if (free_start) return 0;
    double need = (kv < cap ? kv : cap) - room;
    if (need <= 0.0 && n < max_batch) return 0;
    if (slow_start == NULL) return 1;
    PyObject *r = PyObject_CallFunction(slow_start, "ndn", d, need, n - max_batch + 1);
    if (r == NULL) return -1;
    *start = num(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* placement.decode_scan_python over arrays: every instance holding a committed call or tokens,
 * and of each set of idle twins (equal kind, tokens and context) the first; writes the scan and
 * returns its length. seen_kind holds D entries, seen_val 2D. */
static Py_ssize_t idle_scan(Py_ssize_t D, const Py_ssize_t *kind, const double *tokens,
                            const Py_ssize_t *cnt, const double *ctx, Py_ssize_t *seen_kind,
                            double *seen_val, Py_ssize_t *scan) {
    Py_ssize_t nseen = 0, ns = 0;
    for (Py_ssize_t d = 0; d < D; d++) {
        double tk = tokens[d];
        int take = cnt[d] != 0 || tk > 0.0;
        if (!take) { /* the idle sets seen so far are few: a linear search */
            Py_ssize_t j = 0;
            while (j < nseen && !(seen_kind[j] == kind[d] && seen_val[2 * j] == tk &&
                                  seen_val[2 * j + 1] == ctx[d]))
                j++;
            if (j == nseen) {
                seen_kind[nseen] = kind[d];
                seen_val[2 * nseen] = tk, seen_val[2 * nseen + 1] = ctx[d];
                nseen++;
                take = 1;
            }
        }
        if (take) scan[ns++] = d;
    }
    return ns;
}

/* What every call of one Ŝ shares, read once per kernel call into C arrays: the prefill free
 * times and classes, the scan, and for each decode instance the kernel reads (the scan's, or
 * all of them when the scan is empty, as prefill_grid passes it) its call-independent decode
 * terms; the D arrays' other entries are unset. */
typedef struct {
    double now;
    PyObject *slow_start;
    Py_ssize_t K, D, P, nscan;
    double *free;      /* P: Ŝ's prefill free times */
    double *bc, *sl;   /* D: base[b] + slope[b] * ctx[d] and slope[b], b the batch-size column */
    double *cap;       /* D: the capacity of dec_static (the start test's) */
    double *room;      /* D: cap - tokens[d] */
    double *capacity;  /* D: capacity (the fit test's) */
    double *tok;       /* D: tokens[d] */
    Py_ssize_t *cnt, *maxb, *scan, *cls, *mem, *mem_start; /* D, D, nscan, P, P, K + 1 */
    void *block;
} Shared;

static void shared_free(Shared *S) {
    PyMem_Free(S->block);
    S->block = NULL;
}

/* args: now, free, pf_members, pf_class, scan, count, ctx, tokens, dec_static, batch_top,
 * capacity, slow_start. Fills S (free it with shared_free); -1 with an exception on failure. */
static int shared_from(Shared *S, PyObject *const *args, const char *fn) {
    S->block = NULL;
    S->now = num(args[0]);
    PyObject *free = args[1], *members = args[2], *cls = args[3], *scan = args[4];
    PyObject *count = args[5], *ctx = args[6], *tokens = args[7], *dec_static = args[8];
    Py_ssize_t top = PyLong_AsSsize_t(args[9]);
    PyObject *capacity = args[10];
    S->slow_start = args[11];
    if (PyErr_Occurred()) return -1;
    if (!is_seq(free, "free") || !is_seq(members, "pf_members") || !is_seq(cls, "pf_class") ||
        !is_seq(scan, "scan") || !is_seq(count, "count") || !is_seq(ctx, "ctx") ||
        !is_seq(tokens, "tokens") || !is_seq(dec_static, "dec_static") ||
        !is_seq(capacity, "capacity"))
        return -1;
    Py_ssize_t K = Py_SIZE(members), D = Py_SIZE(capacity), P = Py_SIZE(free);
    Py_ssize_t nscan = Py_SIZE(scan);
    S->K = K, S->D = D, S->P = P, S->nscan = nscan;
    if (Py_SIZE(count) != D || Py_SIZE(ctx) != D || Py_SIZE(tokens) != D ||
        Py_SIZE(dec_static) != D || Py_SIZE(cls) != P) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes", fn);
        return -1;
    }
    size_t nd = (size_t)(P + 6 * D), ni = (size_t)(2 * D + nscan + 2 * P + K + 1);
    S->block = PyMem_Malloc(sizeof(double) * nd + sizeof(Py_ssize_t) * ni + 1);
    if (S->block == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    double *f = S->block;
    S->free = f, S->bc = f + P, S->sl = f + P + D, S->cap = f + P + 2 * D;
    S->room = f + P + 3 * D, S->capacity = f + P + 4 * D, S->tok = f + P + 5 * D;
    Py_ssize_t *ix = (Py_ssize_t *)(f + nd);
    S->cnt = ix, S->maxb = ix + D, S->scan = ix + 2 * D, S->cls = ix + 2 * D + nscan;
    S->mem = S->cls + P, S->mem_start = S->mem + P;
    for (Py_ssize_t p = 0; p < P; p++) {
        S->free[p] = dat(free, p);
        S->cls[p] = iat(cls, p);
    }
    if (read_members(members, P, fn, S->mem, S->mem_start) < 0) goto fail;
    for (Py_ssize_t j = 0; j < nscan; j++) {
        Py_ssize_t d = iat(scan, j);
        if (d < 0 || d >= D) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: scan entry %zd", fn, d);
            goto fail;
        }
        S->scan[j] = d;
    }
    /* the decode instances the kernel reads: the scan's, or every one when it is empty */
    Py_ssize_t nread = nscan ? nscan : D;
    for (Py_ssize_t j = 0; j < nread; j++) {
        Py_ssize_t d = nscan ? S->scan[j] : j;
        PyObject *row = at(dec_static, d); /* (capacity, max_batch, base_row, slope_row) */
        if (!is_seq(row, "dec_static[d]")) goto fail;
        Py_ssize_t n = iat(count, d);
        if (row_terms(row, n, top, dat(ctx, d), &S->bc[d], &S->sl[d]) < 0) goto fail;
        S->cap[d] = dat(row, 0);
        S->tok[d] = dat(tokens, d);
        S->room[d] = S->cap[d] - S->tok[d];
        S->capacity[d] = dat(capacity, d);
        S->cnt[d] = n;
        S->maxb[d] = iat(row, 1);
    }
    if (PyErr_Occurred()) goto fail;
    return 0;
fail:
    shared_free(S);
    return -1;
}

/* decode_terms / decode_end of hexagent_gym.planning.placement for decode instance d and one call:
 * sets *start and *end; -1 with an exception set when slow_start fails. */
static int decode_terms(const Shared *S, Py_ssize_t d, double weight, double own_ctx, double kv,
                        int free_start, double *start, double *end) {
    return start_end(S->now, S->bc[d], S->sl[d], S->cap[d], S->room[d], S->cnt[d], S->maxb[d],
                     weight, own_ctx, kv, free_start, S->slow_start, d, start, end);
}

/* The window's transfer tables (ClusterTables.transfer_tables: the setup seconds, then the
 * seconds per prompt token, each D x K doubles, decode-instance-major, in one bytes object):
 * *out points at them, or is NULL for None; -1 with a ValueError naming fn for anything else. */
static int read_xfer(PyObject *xfer, Py_ssize_t D, Py_ssize_t K, const char *fn,
                     const double **out) {
    *out = NULL;
    if (xfer == Py_None) return 0;
    Py_ssize_t want = (Py_ssize_t)sizeof(double) * 2 * D * K;
    if (PyBytes_CheckExact(xfer) && PyBytes_GET_SIZE(xfer) == want) {
        *out = (const double *)PyBytes_AS_STRING(xfer);
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: xfer must be None or bytes of 2 x D x K doubles (%zd "
                 "bytes), got %.200s", fn, want, Py_TYPE(xfer)->tp_name);
    return -1;
}

/* A call's prompt length when its xcols is one (an int, or an integer such as numpy's: its
 * transfer seconds come from the tables), else -1.0 (its xcols are rows); -2.0 with an
 * exception naming fn when it is a length but there are no tables or it is negative. */
static double xcols_tokens(PyObject *xc, const double *xfer, const char *fn) {
    double L;
    if (PyLong_Check(xc)) {
        L = PyLong_AsDouble(xc);
    } else if (PyIndex_Check(xc)) {
        PyObject *i = PyNumber_Index(xc);
        if (i == NULL) return -2.0;
        L = PyLong_AsDouble(i);
        Py_DECREF(i);
    } else {
        return -1.0;
    }
    if (L == -1.0 && PyErr_Occurred()) return -2.0;
    if (xfer != NULL && L >= 0.0) return L;
    PyErr_Format(PyExc_ValueError, xfer == NULL ? "%s: a call's xcols is a prompt length but "
                 "xfer is None" : "%s: a call's prompt length is negative", fn);
    return -2.0;
}

/* n entries of the transfer seconds of a prompt of L tokens into out: setup + L * spt, the
 * same two IEEE operations per entry as ClusterTables._transfer_seconds' numpy expression. */
static inline void xfer_span(const double *setup, const double *spt, Py_ssize_t n, double L,
                             double *out) {
    for (Py_ssize_t j = 0; j < n; j++) out[j] = setup[j] + L * spt[j];
}

/* Row d (K entries) of those seconds, from the tables xfer (read_xfer's layout). */
static inline void xfer_row(const double *xfer, Py_ssize_t D, Py_ssize_t K, double L,
                            Py_ssize_t d, double *out) {
    xfer_span(xfer + d * K, xfer + (D + d) * K, K, L, out);
}

/* Row d of a call's transfer columns given as rows (a tuple or list per decode instance) into
 * out[0..K); -1 on failure. */
static int read_xrow(PyObject *rows, Py_ssize_t d, Py_ssize_t K, double *out) {
    PyObject *row = at(rows, d);
    if (!is_seq(row, "xcols[d]")) return -1;
    if (Py_SIZE(row) != K) {
        PyErr_SetString(PyExc_ValueError, "xcols: one entry per prefill class expected");
        return -1;
    }
    for (Py_ssize_t k = 0; k < K; k++) out[k] = dat(row, k);
    return PyErr_Occurred() ? -1 : 0;
}

/* A call's transfer columns xcols[d][k] (a tuple or list of rows, or its prompt length with
 * the tables xfer) into the D x K C array x (row-major), for the decode instances the kernel
 * reads (the scan's, or all when it is empty); -1 on failure. */
static int read_xcols(const Shared *S, const double *xfer, PyObject *xcols, double *x) {
    Py_ssize_t nread = S->nscan ? S->nscan : S->D;
    double L = xcols_tokens(xcols, xfer, "xcols");
    if (L == -2.0) return -1;
    if (L >= 0.0) {
        if (!S->nscan) { /* every row: one pass over the D x K entries */
            xfer_span(xfer, xfer + S->D * S->K, S->D * S->K, L, x);
            return 0;
        }
        for (Py_ssize_t j = 0; j < nread; j++) {
            Py_ssize_t d = S->scan[j];
            xfer_row(xfer, S->D, S->K, L, d, x + d * S->K);
        }
        return 0;
    }
    if (!is_seq(xcols, "xcols")) return -1;
    if (Py_SIZE(xcols) != S->D) {
        PyErr_SetString(PyExc_ValueError, "xcols: one row per decode instance expected");
        return -1;
    }
    for (Py_ssize_t j = 0; j < nread; j++) {
        Py_ssize_t d = S->nscan ? S->scan[j] : j;
        if (read_xrow(xcols, d, S->K, x + d * S->K) < 0) return -1;
    }
    return 0;
}

/* A call's prefill seconds per instance added to Ŝ's free times: fp[p] = free[p] + pf[p]. */
static int read_fp(const Shared *S, PyObject *pf, double *fp) {
    if (!is_seq(pf, "pf")) return -1;
    if (Py_SIZE(pf) != S->P) {
        PyErr_SetString(PyExc_ValueError, "pf: one entry per prefill instance expected");
        return -1;
    }
    for (Py_ssize_t p = 0; p < S->P; p++) fp[p] = S->free[p] + dat(pf, p);
    return PyErr_Occurred() ? -1 : 0;
}

/* Each prefill class's best member for one call: ready[k] = min(fp[p] for p in members[k]),
 * the class members as flat indices mem[mem_start[k]:mem_start[k + 1]]. */
static void class_ready(Py_ssize_t K, const Py_ssize_t *mem, const Py_ssize_t *mem_start,
                        const double *fp, double *ready) {
    for (Py_ssize_t k = 0; k < K; k++) {
        Py_ssize_t j = mem_start[k], stop = mem_start[k + 1];
        double r = fp[mem[j]];
        for (j++; j < stop; j++) {
            double v = fp[mem[j]];
            if (v < r) r = v;
        }
        ready[k] = r;
    }
}

/* The best Δ over classes on one decode instance: min over k of max(ready[k] + xd[k], start)
 * + end. */
static inline double column_value(Py_ssize_t K, const double *ready, const double *xd,
                                  double start, double end) {
    double col = INFINITY;
    for (Py_ssize_t k = 0; k < K; k++) {
        double a = ready[k] + xd[k];
        double v = (a > start ? a : start) + end;
        if (v < col) col = v;
    }
    return col;
}

/* Whether decode instance d's column value col lowers *best (then cols restarts at d) or
 * reaches it (d joins cols, the decode instances reaching the best so far, in scan order). */
static inline void take_column(double col, Py_ssize_t d, double *best, Py_ssize_t *cols,
                               Py_ssize_t *ncols) {
    if (col < *best) {
        *best = col;
        cols[0] = d;
        *ncols = 1;
    } else if (col == *best) {
        cols[(*ncols)++] = d;
    }
}

static inline void scan_column(Py_ssize_t K, const double *ready, const double *xd, double start,
                               double end, Py_ssize_t d, double *best, Py_ssize_t *cols,
                               Py_ssize_t *ncols) {
    take_column(column_value(K, ready, xd, start, end), d, best, cols, ncols);
}

/* Whether prefill instance p (class k, ready at f) reaches best on one of the tied decode
 * instances cols, lowest d first: that d, else -1. */
static inline Py_ssize_t member_reaches(double f, Py_ssize_t k, Py_ssize_t K, const double *x,
                                        const Py_ssize_t *cols, Py_ssize_t ncols,
                                        const double *starts, const double *ends, double best) {
    for (Py_ssize_t j = 0; j < ncols; j++) {
        Py_ssize_t d = cols[j];
        double a = f + x[d * K + k];
        if ((a > starts[d] ? a : starts[d]) + ends[d] == best) return d;
    }
    return -1;
}

/* The pair np.argmin picks among those reaching best: the classes whose entry reaches it, then
 * their members in ascending order, lowest d first (x: the call's D x K transfer seconds, read
 * at least for the decode instances in cols). One class's members are taken in their stored
 * order, as the Python rule takes them; several classes' members in ascending p, a pass over
 * the P instances (the Python rule's sorted union). Sets *op and *od; -1 with an AssertionError
 * if no pair reaches best. reach holds K flags. */
static int resolve_ties(Py_ssize_t K, Py_ssize_t P, const Py_ssize_t *mem,
                        const Py_ssize_t *mem_start, const Py_ssize_t *cls, const double *fp,
                        const double *ready, const double *x, const Py_ssize_t *cols,
                        Py_ssize_t ncols, const double *starts, const double *ends, double best,
                        Py_ssize_t *reach, Py_ssize_t *op, Py_ssize_t *od) {
    Py_ssize_t nreach = 0, first = -1;
    for (Py_ssize_t k = 0; k < K; k++) {
        reach[k] = member_reaches(ready[k], k, K, x, cols, ncols, starts, ends, best) >= 0;
        if (reach[k] && nreach++ == 0) first = k;
    }
    if (nreach == 1) {
        for (Py_ssize_t j = mem_start[first]; j < mem_start[first + 1]; j++) {
            Py_ssize_t p = mem[j], d = member_reaches(fp[p], first, K, x, cols, ncols, starts,
                                                      ends, best);
            if (d >= 0) {
                *op = p, *od = d;
                return 0;
            }
        }
    } else if (nreach > 1) {
        for (Py_ssize_t p = 0; p < P; p++) {
            if (!reach[cls[p]]) continue;
            Py_ssize_t d = member_reaches(fp[p], cls[p], K, x, cols, ncols, starts, ends, best);
            if (d >= 0) {
                *op = p, *od = d;
                return 0;
            }
        }
    }
    PyErr_SetString(PyExc_AssertionError, "the minimum is reached by some pair");
    return -1;
}

/* Projections.best_prefill_pair_one_python for one call (its prefill seconds pf, its transfer
 * columns xcols with the tables xfer, its decode inputs): sets *op, *od, *obest; -1 with an
 * exception on failure. buf holds K + 2D + P + D·K doubles, ibuf D + K indices. */
static int pair_for_call(const Shared *S, PyObject *pf, PyObject *xcols, const double *xfer,
                         double weight, double own_ctx, double kv, double kv_true,
                         int free_start, double *buf, Py_ssize_t *ibuf, Py_ssize_t *op,
                         Py_ssize_t *od, double *obest) {
    Py_ssize_t K = S->K, D = S->D, P = S->P;
    double *ready = buf, *starts = buf + K, *ends = buf + K + D, *fp = buf + K + 2 * D;
    double *x = fp + P;
    Py_ssize_t *cols = ibuf, *reach = ibuf + D;
    if (read_fp(S, pf, fp) < 0 || read_xcols(S, xfer, xcols, x) < 0) return -1;
    class_ready(K, S->mem, S->mem_start, fp, ready);
    double best = INFINITY;
    Py_ssize_t ncols = 0;
    for (Py_ssize_t s = 0; s < S->nscan; s++) {
        Py_ssize_t d = S->scan[s];
        if (kv_true > S->capacity[d]) continue;
        double start, end;
        if (decode_terms(S, d, weight, own_ctx, kv, free_start, &start, &end) < 0) return -1;
        scan_column(K, ready, x + d * K, start, end, d, &best, cols, &ncols);
        starts[d] = start;
        ends[d] = end;
    }
    *obest = best;
    if (best == INFINITY) { /* no valid pair: argmin of an all-inf row */
        *op = *od = 0;
        return 0;
    }
    return resolve_ties(K, P, S->mem, S->mem_start, S->cls, fp, ready, x, cols, ncols, starts,
                        ends, best, reach, op, od);
}

static int alloc_buffers(const Shared *S, double **buf, Py_ssize_t **ibuf) {
    *buf = PyMem_Malloc(sizeof(double) * (size_t)(S->K + 2 * S->D + S->P + S->D * S->K) + 1);
    *ibuf = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(S->D + S->K) + 1);
    if (*buf == NULL || *ibuf == NULL) {
        PyMem_Free(*buf);
        PyMem_Free(*ibuf);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The per-call lists of best_prefill_pairs and prefill_grid (arguments 12-21): prefill
 * seconds, transfer columns (and the transfer tables), decode inputs and true KV of each call
 * of the window, the decode limits and the slots asked for. */
typedef struct {
    PyObject *pfs, *xcols, *weights, *own, *kvs, *kv_trues, *slots;
    const double *xfer;
    double slack;
    int any_full;
    Py_ssize_t n, m;
    int derive;
} Window;

/* PlanState.limits (the smallest capacity - tokens, whether any batch is full) from what S
 * read: every decode instance, or the scan's. That is enough: an instance the scan leaves out
 * is idle with a twin in it of the same capacity and tokens (so the same slack) and an empty
 * batch. Kernels derive them when passed None: a pass over Ŝ's lists of their own (the
 * decode_limits kernel) costs more than the decision's other reads at 64 decode instances. */
static void shared_limits(const Shared *S, double *slack, int *any_full) {
    Py_ssize_t nread = S->nscan ? S->nscan : S->D;
    double low = INFINITY;
    int full = 0;
    for (Py_ssize_t j = 0; j < nread; j++) {
        Py_ssize_t d = S->nscan ? S->scan[j] : j;
        double room = S->capacity[d] - S->tok[d]; /* as decode_limits */
        if (j == 0 || room < low) low = room;
        full |= S->cnt[d] >= S->maxb[d];
    }
    *slack = low, *any_full = full;
}

static int window_from(Window *w, PyObject *const *args, const char *fn) {
    w->pfs = args[12], w->xcols = args[13], w->weights = args[15], w->own = args[16];
    w->kvs = args[17], w->kv_trues = args[18], w->slots = args[21];
    w->derive = args[19] == Py_None; /* the limits are derived from Ŝ (shared_limits) */
    w->slack = w->derive ? 0.0 : num(args[19]);
    w->any_full = w->derive ? 0 : PyObject_IsTrue(args[20]);
    if (PyErr_Occurred() || w->any_full < 0) return -1;
    if (!is_seq(args[2], "pf_members") || !is_seq(args[10], "capacity") ||
        read_xfer(args[14], Py_SIZE(args[10]), Py_SIZE(args[2]), fn, &w->xfer) < 0)
        return -1;
    if (!is_seq(w->pfs, "pfs") || !is_seq(w->xcols, "xcols") || !is_seq(w->weights, "weights") ||
        !is_seq(w->own, "own_ctxs") || !is_seq(w->kvs, "kvs") ||
        !is_seq(w->kv_trues, "kv_trues") || !is_seq(w->slots, "slots"))
        return -1;
    Py_ssize_t n = Py_SIZE(w->pfs);
    w->n = n, w->m = Py_SIZE(w->slots);
    if (Py_SIZE(w->xcols) != n || Py_SIZE(w->weights) != n || Py_SIZE(w->own) != n ||
        Py_SIZE(w->kvs) != n || Py_SIZE(w->kv_trues) != n) {
        PyErr_Format(PyExc_ValueError, "%s: per-call lists differ in length", fn);
        return -1;
    }
    return 0;
}

/* best_prefill_pairs(now, free, pf_members, pf_class, scan, count, ctx, tokens, dec_static,
 *                    batch_top, capacity, slow_start, pfs, xcols, xfer, weights, own_ctxs,
 *                    kvs, kv_trues, slack, any_full, slots) -> [(p, d, delta), ...]
 * Projections.best_prefill_pair_one_python for each call i in slots (per-call lists indexed by
 * i), under one Ŝ (slack None: the limits are derived, shared_limits):
 * call i's start is free when no batch is full and its demand kvs[i] fits in the smallest
 * slack (Projections._decode_inputs). */
static PyObject *best_prefill_pairs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 22, "best_prefill_pairs")) return NULL;
    Window w;
    if (window_from(&w, args, "best_prefill_pairs") < 0) return NULL;
    PyObject *pfs = w.pfs, *xcols = w.xcols, *weights = w.weights, *own = w.own;
    PyObject *kvs = w.kvs, *kv_trues = w.kv_trues, *slots = w.slots;
    double slack = w.slack;
    int any_full = w.any_full;
    Py_ssize_t n = w.n, m = w.m;
    Shared S;
    if (shared_from(&S, args, "best_prefill_pairs") < 0) return NULL;
    if (w.derive) shared_limits(&S, &slack, &any_full);
    double *buf = NULL;
    Py_ssize_t *ibuf = NULL;
    PyObject *out = NULL;
    if (alloc_buffers(&S, &buf, &ibuf) < 0) goto fail;
    out = PyList_New(m);
    if (out == NULL) goto fail;
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t i = iat(slots, j), p, d;
        if (PyErr_Occurred()) goto fail;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "best_prefill_pairs: slot %zd out of range", i);
            goto fail;
        }
        double kv = dat(kvs, i), best;
        int free_start = !any_full && kv <= slack;
        double weight = dat(weights, i), own_ctx = dat(own, i), kv_true = dat(kv_trues, i);
        if (PyErr_Occurred()) goto fail;
        if (pair_for_call(&S, at(pfs, i), at(xcols, i), w.xfer, weight, own_ctx, kv, kv_true,
                          free_start, buf, ibuf, &p, &d, &best) < 0)
            goto fail;
        PyObject *t = Py_BuildValue("nnd", p, d, best);
        if (t == NULL) goto fail;
        PyList_SET_ITEM(out, j, t);
    }
    PyMem_Free(buf);
    PyMem_Free(ibuf);
    shared_free(&S);
    return out;
fail:
    Py_XDECREF(out);
    PyMem_Free(buf);
    PyMem_Free(ibuf);
    shared_free(&S);
    return NULL;
}

/* prefill_grid(now, free, pf_members, pf_class, scan, count, ctx, tokens, dec_static, batch_top,
 *              capacity, slow_start, pfs, xcols, xfer, weights, own_ctxs, kvs, kv_trues,
 *              slack, any_full, slots, out) -> None
 * Projections.prefill_delta_one of each call i in slots (best_prefill_pairs' arguments; scan is
 * unused: every decode instance gets its entry), written into row i of out, a C-contiguous
 * writable float64 buffer of n * P * D doubles: out[i, p, d] = max(free[p] + pf[p] + x[d][k],
 * start_d) + end_d, with k the class of p; inf where the call's true KV exceeds d's capacity.
 * Rows of calls not in slots are left as they are. */
static PyObject *prefill_grid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 23, "prefill_grid")) return NULL;
    Window w;
    if (window_from(&w, args, "prefill_grid") < 0) return NULL;
    PyObject *pfs = w.pfs, *xcols = w.xcols, *weights = w.weights, *own = w.own;
    PyObject *kvs = w.kvs, *kv_trues = w.kv_trues, *slots = w.slots;
    double slack = w.slack;
    int any_full = w.any_full;
    Py_ssize_t n = w.n, m = w.m;
    Py_buffer view;
    if (PyObject_GetBuffer(args[22], &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        < 0)
        return NULL;
    Shared S;
    if (shared_from(&S, args, "prefill_grid") < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (w.derive) shared_limits(&S, &slack, &any_full);
    Py_ssize_t P = S.P, D = S.D, K = S.K;
    double *buf = NULL;
    if (view.itemsize != (Py_ssize_t)sizeof(double) || view.format == NULL ||
        strcmp(view.format, "d") != 0 || view.len != (Py_ssize_t)sizeof(double) * n * P * D) {
        PyErr_Format(PyExc_ValueError, "prefill_grid: out must be float64 of %zd x %zd x %zd",
                     n, P, D);
        goto fail;
    }
    buf = PyMem_Malloc(sizeof(double) * (size_t)(3 * D + P + D * K) + 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    double *starts = buf, *ends = buf + D, *fp = buf + 2 * D, *grid = view.buf;
    double *big = buf + 2 * D + P; /* 1.0 where the call cannot fit on d */
    double *x = big + D;
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t i = iat(slots, j);
        if (PyErr_Occurred()) goto fail;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "prefill_grid: slot %zd out of range", i);
            goto fail;
        }
        if (read_fp(&S, at(pfs, i), fp) < 0 || read_xcols(&S, w.xfer, at(xcols, i), x) < 0)
            goto fail;
        double kv = dat(kvs, i), weight = dat(weights, i), own_ctx = dat(own, i);
        double kv_true = dat(kv_trues, i);
        if (PyErr_Occurred()) goto fail;
        int free_start = !any_full && kv <= slack;
        for (Py_ssize_t d = 0; d < D; d++) {
            if (decode_terms(&S, d, weight, own_ctx, kv, free_start, &starts[d], &ends[d]) < 0)
                goto fail;
            big[d] = kv_true > S.capacity[d] ? 1.0 : 0.0;
        }
        double *row = grid + i * P * D;
        for (Py_ssize_t p = 0; p < P; p++) {
            const double *xk = x + S.cls[p];
            double f = fp[p];
            double *out = row + p * D;
            for (Py_ssize_t d = 0; d < D; d++) {
                if (big[d] != 0.0) {
                    out[d] = INFINITY;
                    continue;
                }
                double a = f + xk[d * K];
                out[d] = (a > starts[d] ? a : starts[d]) + ends[d];
            }
        }
    }
    PyMem_Free(buf);
    shared_free(&S);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    PyMem_Free(buf);
    shared_free(&S);
    PyBuffer_Release(&view);
    return NULL;
}

/* decode_limits(capacity, tokens, count, max_batch) -> (slack, any_full)
 * PlanState._decode_limits_python: (min(capacity[d] - tokens[d]), any(count[d] >= max_batch[d]))
 * over the decode instances (slack inf with none). */
static PyObject *decode_limits(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *const names[4] = {"capacity", "tokens", "count", "max_batch"};
    Py_ssize_t D;
    if (four_lists(args, nargs, "decode_limits", names, &D) < 0) return NULL;
    PyObject *cap = args[0], *tokens = args[1], *count = args[2], *top = args[3];
    double slack = INFINITY;
    int full = 0;
    for (Py_ssize_t d = 0; d < D; d++) {
        double s = dat(cap, d) - dat(tokens, d);
        if (d == 0 || s < slack) slack = s; /* min() keeps the first of equal values */
        if (!full) {
            PyObject *c = at(count, d), *m = at(top, d);
            if (PyLong_CheckExact(c) && PyLong_CheckExact(m))
                full = as_ssize(c) >= as_ssize(m);
            else
                full = num(c) >= num(m);
        }
    }
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(dO)", slack, full ? Py_True : Py_False);
}

static inline float clipped(double x, double clip) { return (float)(clip < x ? clip : x); }

/* o as a writable C-contiguous float32 numpy array of ndim dimensions, or NULL with a
 * ValueError naming the kernel fn and the argument. */
static PyArrayObject *f32_array(PyObject *o, int ndim, const char *fn, const char *name) {
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != NPY_FLOAT32 ||
        PyArray_NDIM((PyArrayObject *)o) != ndim ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)o)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be a writable C-contiguous float32 array "
                     "of %d dimensions", fn, name, ndim);
        return NULL;
    }
    return (PyArrayObject *)o;
}

/* A new array with tpl's shape and contents (tpl: a C-contiguous float32 array). Cheaper than
 * PyArray_NewCopy, which runs numpy's general assignment machinery. */
static PyArrayObject *fresh_copy(PyArrayObject *tpl) {
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(PyArray_NDIM(tpl), PyArray_DIMS(tpl),
                                                            NPY_FLOAT32);
    if (out != NULL) memcpy(PyArray_DATA(out), PyArray_DATA(tpl), (size_t)PyArray_NBYTES(tpl));
    return out;
}

static PyObject *obs_keys[6]; /* "calls", "delta", "prefill", "decode", "globals", "cached" */

/* observe_step(delta, picked, age, h_est, free, tokens, count, capacity, max_batch, calls_t,
 *              pre_t, dec_t, glob_t, cached_t, grid_t, inv, clip, now, picks, cols)
 *     -> (obs, mask)
 * hexagent_gym.envs.encoding.Encoder.observe, compiled: the observation dict of a decision point under the
 * current Ŝ and its flat joint mask, as fresh arrays.
 * - delta: the window's Δ, float64 (n, P, D) seconds (inf: invalid). "delta" is a copy of
 *   grid_t, the blank float32 (K, P_max, D_max) grid (every entry the masked value), with
 *   (float) min(delta * inv, clip) where delta is finite; mask (bool, K * P_max * D_max) is
 *   true exactly there.
 *   best[i] = row i's smallest Δ (inf when none is finite).
 * - "calls", "prefill", "decode", "globals", "cached": copies of the float32 templates calls_t
 *   (K, C), pre_t (P_max, F), dec_t (D_max, G), glob_t (H,), cached_t (K, P_max), then, with
 *   cols = (picked, min, risk, free, kv, count, unpicked, picks) column indices:
 *   calls[i, picked] = picked[i], calls[i, min] = min(best[i] * inv, clip),
 *   calls[i, risk] = min((age[i] + best[i]) / h_est[i], clip) for the n slots;
 *   prefill[p, free] = min((free[p] - now) * inv, clip);
 *   decode[d, kv] = min(tokens[d] / capacity[d], clip), decode[d, count] =
 *   min(count[d] / max_batch[d], clip); globals[unpicked] = (n - picks) / K,
 *   globals[picks] = picks / K.
 * Float64 arithmetic in the Python order, then float32; min(x, clip) is Python's (x unless
 * clip < x). */
static PyObject *observe_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 20, "observe_step")) return NULL;
    PyObject *picked = args[1], *age = args[2], *h_est = args[3], *free = args[4];
    PyObject *tokens = args[5], *count = args[6], *cap = args[7], *top = args[8];
    PyObject *cols = args[19];
    double inv = num(args[15]), clip = num(args[16]), now = num(args[17]);
    Py_ssize_t picks = PyLong_AsSsize_t(args[18]);
    if (PyErr_Occurred() || !is_seq(picked, "picked") || !is_seq(age, "age") ||
        !is_seq(h_est, "h_est") || !is_seq(free, "free") || !is_seq(tokens, "tokens") ||
        !is_seq(count, "count") || !is_seq(cap, "capacity") || !is_seq(top, "max_batch") ||
        !is_seq(cols, "cols"))
        return NULL;
    if (Py_SIZE(cols) != 8) {
        PyErr_SetString(PyExc_ValueError, "observe_step: cols must hold 8 column indices");
        return NULL;
    }
    Py_ssize_t c[8];
    for (int j = 0; j < 8; j++) c[j] = iat(cols, j);
    if (PyErr_Occurred()) return NULL;
    PyArrayObject *tpl[6];
    static const char *const tnames[6] = {"calls_t", "pre_t", "dec_t", "glob_t", "cached_t",
                                          "grid_t"};
    static const int tdims[6] = {2, 2, 2, 1, 2, 3};
    for (int j = 0; j < 6; j++)
        if ((tpl[j] = f32_array(args[9 + j], tdims[j], "observe_step", tnames[j])) == NULL)
            return NULL;
    if (!PyArray_Check(args[0]) || PyArray_TYPE((PyArrayObject *)args[0]) != NPY_DOUBLE ||
        PyArray_NDIM((PyArrayObject *)args[0]) != 3) {
        PyErr_SetString(PyExc_ValueError, "observe_step: delta must be a float64 (n, P, D) "
                        "array");
        return NULL;
    }
    Py_ssize_t K = PyArray_DIM(tpl[5], 0), PM = PyArray_DIM(tpl[5], 1);
    Py_ssize_t DM = PyArray_DIM(tpl[5], 2);
    PyArrayObject *dv = (PyArrayObject *)args[0];
    Py_ssize_t n = PyArray_DIM(dv, 0), P = PyArray_DIM(dv, 1), D = PyArray_DIM(dv, 2);
    npy_intp *ct = PyArray_DIMS(tpl[0]), *pt = PyArray_DIMS(tpl[1]), *dt = PyArray_DIMS(tpl[2]);
    Py_ssize_t H = PyArray_DIM(tpl[3], 0);
    if (Py_SIZE(picked) != n || Py_SIZE(age) != n || Py_SIZE(h_est) != n ||
        Py_SIZE(free) != P || Py_SIZE(tokens) != D || Py_SIZE(count) != D ||
        Py_SIZE(cap) != D || Py_SIZE(top) != D) {
        PyErr_SetString(PyExc_ValueError, "observe_step: inconsistent sizes");
        return NULL;
    }
    if (K <= 0 || n > K || P > PM || D > DM || ct[0] != K || pt[0] < P || dt[0] < D ||
        PyArray_DIM(tpl[4], 0) != K || PyArray_DIM(tpl[4], 1) < P ||
        c[0] < 0 || c[1] < 0 || c[2] < 0 || c[0] >= ct[1] || c[1] >= ct[1] || c[2] >= ct[1] ||
        c[3] < 0 || c[3] >= pt[1] || c[4] < 0 || c[5] < 0 || c[4] >= dt[1] || c[5] >= dt[1] ||
        c[6] < 0 || c[7] < 0 || c[6] >= H || c[7] >= H) {
        PyErr_SetString(PyExc_ValueError, "observe_step: the window, instances or columns do "
                        "not fit the templates");
        return NULL;
    }
    PyArrayObject *contig = NULL, *arr[7] = {NULL};  /* calls, grid, pre, dec, glob, cached, mask */
    PyObject *obs = NULL, *result = NULL;
    double *best = NULL;
    contig = (PyArrayObject *)PyArray_FromAny(args[0], PyArray_DescrFromType(NPY_DOUBLE), 3, 3,
                                              NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED, NULL);
    if (contig == NULL) goto done;
    npy_intp total = K * PM * DM;
    arr[0] = fresh_copy(tpl[0]);
    arr[1] = fresh_copy(tpl[5]);
    arr[2] = fresh_copy(tpl[1]);
    arr[3] = fresh_copy(tpl[2]);
    arr[4] = fresh_copy(tpl[3]);
    arr[5] = fresh_copy(tpl[4]);
    arr[6] = (PyArrayObject *)PyArray_ZEROS(1, &total, NPY_BOOL, 0);
    best = PyMem_Malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int j = 0; j < 7; j++)
        if (arr[j] == NULL) goto done;
    if (best == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* the Δ grid, the mask and each row's smallest Δ */
    const double *src = PyArray_DATA(contig);
    float *grid = PyArray_DATA(arr[1]);
    char *mask = PyArray_DATA(arr[6]);
    for (Py_ssize_t i = 0; i < n; i++) {
        double low = INFINITY;
        for (Py_ssize_t p = 0; p < P; p++) {
            const double *row = src + (i * P + p) * D;
            Py_ssize_t at0 = (i * PM + p) * DM;
            for (Py_ssize_t d = 0; d < D; d++) {
                double v = row[d];
                if (v < low) low = v;
                if (isfinite(v)) {
                    grid[at0 + d] = clipped(v * inv, clip);
                    mask[at0 + d] = 1;
                }
            }
        }
        best[i] = low;
    }
    /* the per-step columns */
    float *calls = PyArray_DATA(arr[0]), *pre = PyArray_DATA(arr[2]);
    float *dec = PyArray_DATA(arr[3]), *glob = PyArray_DATA(arr[4]);
    Py_ssize_t cw = ct[1], pw = pt[1], dw = dt[1];
    for (Py_ssize_t i = 0; i < n; i++) {
        int is = PyObject_IsTrue(at(picked, i));
        if (is < 0) goto done;
        double h = dat(h_est, i), a = dat(age, i);
        if (PyErr_Occurred()) goto done;
        if (h == 0.0) {
            PyErr_SetString(PyExc_ZeroDivisionError, "observe_step: h_est is 0");
            goto done;
        }
        float *row = calls + i * cw;
        row[c[0]] = is ? 1.0f : 0.0f;
        row[c[1]] = clipped(best[i] * inv, clip);
        row[c[2]] = clipped((a + best[i]) / h, clip);
    }
    for (Py_ssize_t p = 0; p < P; p++) {
        double f = dat(free, p);
        if (PyErr_Occurred()) goto done;
        pre[p * pw + c[3]] = clipped((f - now) * inv, clip);
    }
    for (Py_ssize_t d = 0; d < D; d++) {
        double cp = dat(cap, d), mb = dat(top, d), tk = dat(tokens, d), cn = dat(count, d);
        if (PyErr_Occurred()) goto done;
        if (cp == 0.0 || mb == 0.0) {
            PyErr_SetString(PyExc_ZeroDivisionError, "observe_step: a capacity is 0");
            goto done;
        }
        dec[d * dw + c[4]] = clipped(tk / cp, clip);
        dec[d * dw + c[5]] = clipped(cn / mb, clip);
    }
    glob[c[6]] = (float)((double)(n - picks) / (double)K);
    glob[c[7]] = (float)((double)picks / (double)K);
    obs = PyDict_New();
    if (obs == NULL) goto done;
    for (int j = 0; j < 6; j++) /* calls, delta (the grid), prefill, decode, globals, cached */
        if (PyDict_SetItem(obs, obs_keys[j], (PyObject *)arr[j]) < 0) goto done;
    result = PyTuple_Pack(2, obs, (PyObject *)arr[6]);
done:
    PyMem_Free(best);
    Py_XDECREF(contig);
    for (int j = 0; j < 7; j++) Py_XDECREF(arr[j]);
    Py_XDECREF(obs);
    return result;
}

/* Interned attribute names of the core's entities read by begin_rows and commit_prefill_picks
 * (set at import). */
enum { A_WORKFLOW, A_ARRIVAL, A_H_EST, A_TRANSFER_END, A_REVEAL_T, A_L_IN, A_L_OUT_PRED,
       A_EST_DURATION, A_NUM_DONE, A_SERVICE, A_OPEN_CALLS, A_CACHED, A_RUNNING, A_QUEUE,
       A_BATCH, A_WAITING, A_PF_EST, A_PF_COLD, A_KV_PRED, A_CTX_SHARE, A_UID, A_SPEC,
       A_APP_ID, A_FORECAST_STAMP, A_COUNT };
static const char *const attr_names[A_COUNT] = {
    "workflow", "arrival", "h_est", "transfer_end", "reveal_t", "l_in", "l_out_pred",
    "est_duration", "num_done", "service", "open_calls", "cached", "running", "queue", "batch",
    "waiting", "pf_est", "pf_cold", "kv_pred", "ctx_share", "uid", "spec", "app_id",
    "forecast_stamp"};
static PyObject *attr_str[A_COUNT];

/* Where each name lives in the last type it was read from, when that type keeps it in a
 * __slots__ slot (the core's entities do): a slot read is then a load at a fixed offset, as the
 * slot's member descriptor itself does, instead of the generic attribute lookup (an MRO cache
 * probe, the descriptor's call and its checks, several times the read). The type is held (so
 * its address cannot be reused by another type) and its version tag checked on every read
 * (assigning to a type attribute changes it). */
typedef struct {
    PyTypeObject *type;
    unsigned int version;
    Py_ssize_t offset;
} SlotAt;
static SlotAt slot_at[A_COUNT];

/* obj.<name>, a new reference (NULL with an error set, as PyObject_GetAttr). */
static PyObject *attr(PyObject *obj, int name) {
    PyTypeObject *tp = Py_TYPE(obj);
    SlotAt *where = &slot_at[name];
    if (where->type != tp || where->version != tp->tp_version_tag ||
        !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        /* the generic lookup applies unless the type keeps name in a plain object slot and
         * reads attributes the default way (no __getattribute__ of its own) */
        PyObject *descr = tp->tp_getattro == PyObject_GenericGetAttr
                              ? _PyType_Lookup(tp, attr_str[name]) : NULL; /* borrowed */
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX ||
            !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
            return PyObject_GetAttr(obj, attr_str[name]);
        Py_INCREF(tp);
        Py_XSETREF(where->type, tp);
        where->version = tp->tp_version_tag;
        where->offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    PyObject *v = *(PyObject **)((char *)obj + where->offset);
    if (v == NULL) return PyObject_GetAttr(obj, attr_str[name]); /* unset: its AttributeError */
    Py_INCREF(v);
    return v;
}

/* obj.<name> as a double (attr_num) or len(obj.<name>) (attr_len); with an error set when the
 * attribute is missing or of the wrong kind (the caller checks PyErr_Occurred). */
static double attr_num(PyObject *obj, int name) {
    PyObject *v = attr(obj, name);
    if (v == NULL) return NAN;
    double x = num(v);
    Py_DECREF(v);
    return x;
}

static double attr_len(PyObject *obj, int name) {
    PyObject *v = attr(obj, name);
    if (v == NULL) return -1.0;
    Py_ssize_t n = PyObject_Size(v);
    Py_DECREF(v);
    return (double)n;
}

/* begin_rows(calls, decode_stage, now, inv, clip, log_tokens, table, cached, clear, prefill,
 *            pre, decode, dec, max_batch, cols, glob, glob_values)
 *     -> (age, h_est, running, batched)
 * hexagent_gym.envs.encoding._begin_rows_python, compiled: the features fixed within a decision point,
 * written in place into the float32 arrays table (K, 14), cached (K, P_max), pre, dec and glob.
 * First table's rows [n, clear) and cached's rows [0, clear) become 0 (the previous window's).
 * For each call i (a Call of the core): table[i] = min(row, clip) of (1, 0, a * inv,
 * (now - entered) * inv, h * inv, a / h or 0 when h <= 0, tok(l_in), tok(l_out_pred),
 * est_duration * inv, log1p(num_done), service * inv, log1p(len(open_calls)), clip, clip)
 * (CALL_FEATURES' order) with a = now - workflow.arrival, h = workflow.h_est, entered =
 * transfer_end at the decode stage else reveal_t, tok(x) = log1p(x) / log_tokens; at the
 * prefill stage, cached[i, p] = min(cached_hits[p] / max(l_in, 1), 1) for calls whose cached
 * view is set. For each prefill instance p: pre[p, cols[0]] = log1p(len(queue)),
 * pre[p, cols[1]] = running is not None; for each decode instance d:
 * dec[d, cols[2]] = len(batch) / max_batch[d], dec[d, cols[3]] = log1p(len(waiting)).
 * glob[j] = glob_values[j]. Returns (age, h_est, running, batched): the lists age (a per call)
 * and h_est (h, or 1e-9 when h <= 0), the prefill instances running a prefill and the calls in
 * decode batches. Arithmetic in float64 in the Python order, then float32. */
static PyObject *begin_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 17, "begin_rows")) return NULL;
    PyObject *calls = args[0], *pinst = args[9], *dinst = args[11], *top = args[13];
    PyObject *cols = args[14], *gvals = args[16];
    int decode_stage = PyObject_IsTrue(args[1]);
    double now = num(args[2]), inv = num(args[3]), clip = num(args[4]), lt = num(args[5]);
    Py_ssize_t clear = PyLong_AsSsize_t(args[8]);
    if (decode_stage < 0 || PyErr_Occurred() || !is_seq(calls, "calls") ||
        !is_seq(pinst, "prefill") || !is_seq(dinst, "decode") || !is_seq(top, "max_batch") ||
        !is_seq(cols, "cols") || !is_seq(gvals, "glob_values"))
        return NULL;
    if (Py_SIZE(cols) != 4) {
        PyErr_SetString(PyExc_ValueError, "begin_rows: cols must hold 4 column indices");
        return NULL;
    }
    Py_ssize_t c[4];
    for (int j = 0; j < 4; j++) c[j] = iat(cols, j);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n = Py_SIZE(calls), P = Py_SIZE(pinst), D = Py_SIZE(dinst);
    PyArrayObject *ta, *ka, *pa, *da, *ga;
    if ((ta = f32_array(args[6], 2, "begin_rows", "table")) == NULL ||
        (ka = f32_array(args[7], 2, "begin_rows", "cached")) == NULL ||
        (pa = f32_array(args[10], 2, "begin_rows", "pre")) == NULL ||
        (da = f32_array(args[12], 2, "begin_rows", "dec")) == NULL ||
        (ga = f32_array(args[15], 1, "begin_rows", "glob")) == NULL)
        return NULL;
    Py_ssize_t K = PyArray_DIM(ta, 0), tw = PyArray_DIM(ta, 1), kw = PyArray_DIM(ka, 1);
    Py_ssize_t pw = PyArray_DIM(pa, 1), dw = PyArray_DIM(da, 1);
    if (tw != 14 || n > K || PyArray_DIM(ka, 0) != K || clear < 0 || clear > K || P > kw ||
        P > PyArray_DIM(pa, 0) || D > PyArray_DIM(da, 0) || Py_SIZE(top) != D ||
        Py_SIZE(gvals) != PyArray_DIM(ga, 0) || c[0] < 0 || c[1] < 0 || c[0] >= pw ||
        c[1] >= pw || c[2] < 0 || c[3] < 0 || c[2] >= dw || c[3] >= dw) {
        PyErr_SetString(PyExc_ValueError, "begin_rows: rows or columns out of range (table "
                        "must have 14 columns, max_batch one entry per decode instance, "
                        "glob_values one per glob entry)");
        return NULL;
    }
    PyObject *age = NULL, *hest = NULL, *result = NULL, *wf = NULL, *hits = NULL;
    float *table = PyArray_DATA(ta), *cached = PyArray_DATA(ka), *pre = PyArray_DATA(pa);
    float *dec = PyArray_DATA(da), *glob = PyArray_DATA(ga);
    for (Py_ssize_t j = 0; j < PyArray_DIM(ga, 0); j++) {
        double g = dat(gvals, j);
        if (PyErr_Occurred()) return NULL;
        glob[j] = (float)g;
    }
    if (clear > n) memset(table + n * tw, 0, sizeof(float) * (size_t)((clear - n) * tw));
    memset(cached, 0, sizeof(float) * (size_t)(clear * kw));
    age = PyList_New(n);
    hest = PyList_New(n);
    if (age == NULL || hest == NULL) goto done;
    Py_ssize_t running_n = 0, batched = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *call = at(calls, i);
        wf = attr(call, A_WORKFLOW);
        if (wf == NULL) goto done;
        /* read one by one, stopping at the first error (no API call with an error set) */
        static const int from_wf[5] = {A_ARRIVAL, A_H_EST, A_NUM_DONE, A_SERVICE, A_OPEN_CALLS};
        double w[5], cv[4];
        int from_call[4] = {decode_stage ? A_TRANSFER_END : A_REVEAL_T, A_L_IN, A_L_OUT_PRED,
                            A_EST_DURATION};
        for (int j = 0; j < 5; j++) {
            w[j] = j == 4 ? attr_len(wf, from_wf[j]) : attr_num(wf, from_wf[j]);
            if (PyErr_Occurred()) goto done;
        }
        for (int j = 0; j < 4; j++) {
            cv[j] = attr_num(call, from_call[j]);
            if (PyErr_Occurred()) goto done;
        }
        Py_CLEAR(wf);
        double a = now - w[0], h = w[1], done_n = w[2], service = w[3], opened = w[4];
        double entered = cv[0], l_in = cv[1], l_out = cv[2], est = cv[3];
        PyObject *av = PyFloat_FromDouble(a), *hv = PyFloat_FromDouble(h > 0.0 ? h : 1e-9);
        if (av == NULL || hv == NULL) {
            Py_XDECREF(av);
            Py_XDECREF(hv);
            goto done;
        }
        PyList_SET_ITEM(age, i, av);
        PyList_SET_ITEM(hest, i, hv);
        double row[14] = {1.0, 0.0, a * inv, (now - entered) * inv, h * inv,
                          h > 0.0 ? a / h : 0.0, log1p(l_in) / lt, log1p(l_out) / lt, est * inv,
                          log1p(done_n), service * inv, log1p(opened), clip, clip};
        float *out = table + i * tw;
        for (int j = 0; j < 14; j++) out[j] = clipped(row[j], clip);
        if (decode_stage) continue;
        hits = attr(call, A_CACHED);
        if (hits == NULL) goto done;
        if (hits != Py_None) {
            if (!is_seq(hits, "Call.cached")) goto done;
            if (Py_SIZE(hits) != P) {
                PyErr_SetString(PyExc_ValueError, "begin_rows: a call's cached view does not "
                                "have one entry per prefill instance");
                goto done;
            }
            double whole = l_in > 1.0 ? l_in : 1.0;
            for (Py_ssize_t p = 0; p < P; p++) {
                double hit = dat(hits, p);
                if (PyErr_Occurred()) goto done;
                cached[i * kw + p] = clipped(hit / whole, 1.0);
            }
        }
        Py_CLEAR(hits);
    }
    for (Py_ssize_t p = 0; p < P; p++) {
        PyObject *inst = at(pinst, p), *running = attr(inst, A_RUNNING);
        if (running == NULL) goto done;
        double queued = attr_len(inst, A_QUEUE);
        if (PyErr_Occurred()) {
            Py_DECREF(running);
            goto done;
        }
        pre[p * pw + c[0]] = (float)log1p(queued);
        pre[p * pw + c[1]] = running != Py_None ? 1.0f : 0.0f;
        running_n += running != Py_None;
        Py_DECREF(running);
    }
    for (Py_ssize_t d = 0; d < D; d++) {
        PyObject *inst = at(dinst, d);
        double batch = attr_len(inst, A_BATCH);
        if (PyErr_Occurred()) goto done;
        double waiting = attr_len(inst, A_WAITING);
        if (PyErr_Occurred()) goto done;
        double most = dat(top, d);
        if (PyErr_Occurred()) goto done;
        if (most == 0.0) {
            PyErr_SetString(PyExc_ZeroDivisionError, "begin_rows: a decode max_batch is 0");
            goto done;
        }
        dec[d * dw + c[2]] = (float)(batch / most);
        batched += (Py_ssize_t)batch;
        dec[d * dw + c[3]] = (float)log1p(waiting);
    }
    result = Py_BuildValue("(OOnn)", age, hest, running_n, batched);
done:
    Py_XDECREF(wf);
    Py_XDECREF(hits);
    Py_XDECREF(age);
    Py_XDECREF(hest);
    return result;
}

/* The mutable Ŝ and the window of risk_plan, as C arrays. */
typedef struct {
    double now, slack;
    int any_full;
    Py_ssize_t n, P, D, K, top, nscan;
    PyObject *dec_static;
    double *free, *tokens, *ctx, *bc, *sl, *cap, *room, *capacity;  /* P, then D each */
    double *pf, *x, *weight, *own, *kv, *kvt, *share, *arr, *h;       /* n·P, n·D·K, n each */
    PyObject *xcols;   /* the calls' transfer columns, read into x on first use per (call, d) */
    const double *xfer; /* the transfer tables (read_xfer), for calls given as prompt lengths */
    double *len;       /* n: a call's prompt length, or -1 where its xcols are rows */
    char *xread;       /* n·D: x holds call i's row d */
    char *fresh;       /* D: bc, sl and room hold d's current terms */
    double *ready, *starts, *ends, *seen_val;                          /* K, D, D, 2D */
    Py_ssize_t *cnt, *maxb, *kind, *scan, *cls, *mem, *mem_start, *cols, *reach;
    Py_ssize_t *seen_kind;
    char *picked;
    /* Each slot's last answer, kept exact commit by commit (plan_slot): its column values over
     * the scan (colv, n·D; inf where the call does not fit), its class ready times (rdy, n·K),
     * its ready time per prefill instance (fpv, n·P), the number of commits it holds for (ver,
     * n; -2: none) and its free_start (fsv, n). A commit changes one prefill instance's free
     * time and one decode instance's terms, and may add that instance's idle twin to the
     * scan: last_p, last_d and twin (-1: none). */
    double *colv, *rdy, *fpv;
    Py_ssize_t *ver, *oscan, commits, last_p, last_d, twin;
    char *fsv;
    void *block;
} Plan;

/* d's call-independent decode terms from its count and context (decode_terms' arithmetic),
 * computed when a pair first needs them after a change of d. */
static int plan_terms(Plan *W, Py_ssize_t d) {
    W->fresh[d] = 1;
    W->room[d] = W->cap[d] - W->tokens[d];
    return row_terms(at(W->dec_static, d), W->cnt[d], W->top, W->ctx[d], &W->bc[d], &W->sl[d]);
}

/* placement.decode_scan_python over the plan's decode lists. */
static void plan_scan(Plan *W) {
    W->nscan = idle_scan(W->D, W->kind, W->tokens, W->cnt, W->ctx, W->seen_kind, W->seen_val,
                         W->scan);
}

/* Slot i's transfer seconds to decode instance d, per class, into x: computed from its prompt
 * length and the tables, or read from its rows (risk_plan checked the sizes). */
static int plan_read_x(Plan *W, Py_ssize_t i, Py_ssize_t d) {
    Py_ssize_t K = W->K;
    double *x = W->x + (i * W->D + d) * K;
    if (W->len[i] >= 0.0)
        xfer_row(W->xfer, W->D, K, W->len[i], d, x);
    else if (read_xrow(at(W->xcols, i), d, K, x) < 0)
        return -1;
    W->xread[i * W->D + d] = 1;
    return 0;
}

/* start_end for slot i on decode instance d under the plan (d's terms refreshed first if a
 * commit changed them): 0 with *start and *end, 1 where a decode limit binds (not modelled),
 * -1 on error. */
static inline int plan_start_end(Plan *W, Py_ssize_t i, Py_ssize_t d, int free_start, double *start,
                                 double *end) {
    if (!W->fresh[d] && plan_terms(W, d) < 0) return -1;
    return start_end(W->now, W->bc[d], W->sl[d], W->cap[d], W->room[d], W->cnt[d], W->maxb[d],
                     W->weight[i], W->own[i], W->kv[i], free_start, NULL, d, start, end);
}

/* pair_for_call over the plan's arrays for window slot i. Returns 1 with the pair, 0 when the
 * slot has no valid pair or its projection needs what the plan does not model (a decode limit
 * that binds: slow_start), -1 on error. */
static int plan_pair(Plan *W, Py_ssize_t i, Py_ssize_t *op, Py_ssize_t *od, double *obest) {
    Py_ssize_t K = W->K, P = W->P;
    double kv_true = W->kvt[i], *fp = W->fpv + i * P, *ready = W->ready;
    const double *pf = W->pf + i * P;
    double *x = W->x + i * W->D * K;
    char *xread = W->xread + i * W->D;
    int free_start = !W->any_full && W->kv[i] <= W->slack;
    double *colv = W->colv + i * W->D;
    W->ver[i] = -2;
    for (Py_ssize_t p = 0; p < P; p++) fp[p] = W->free[p] + pf[p];
    class_ready(K, W->mem, W->mem_start, fp, ready);
    double best = INFINITY;
    Py_ssize_t ncols = 0;
    for (Py_ssize_t s = 0; s < W->nscan; s++) {
        Py_ssize_t d = W->scan[s];
        if (kv_true > W->capacity[d]) {
            colv[d] = INFINITY;
            continue;
        }
        if (!xread[d] && plan_read_x(W, i, d) < 0) return -1;
        double start, end;
        int r = plan_start_end(W, i, d, free_start, &start, &end);
        if (r != 0) return r < 0 ? -1 : 0; /* a binding limit (slow_start): not modelled */
        double col = column_value(K, ready, x + d * K, start, end);
        colv[d] = col;
        take_column(col, d, &best, W->cols, &ncols);
        W->starts[d] = start;
        W->ends[d] = end;
    }
    *obest = best;
    if (best == INFINITY) return 0; /* no valid pair: the pick raises in Python */
    if (resolve_ties(K, P, W->mem, W->mem_start, W->cls, fp, ready, x, W->cols, ncols,
                     W->starts, W->ends, best, W->reach, op, od) < 0)
        return -1;
    memcpy(W->rdy + i * K, ready, sizeof(double) * (size_t)K);
    W->ver[i] = W->commits;
    W->fsv[i] = (char)free_start;
    return 1;
}

/* plan_pair for slot i from its answer one commit ago, when that answer is exact and the slot's
 * free_start is unchanged: the commit (last_p, last_d) moved one prefill free time and one
 * decode instance's terms, so unless the slot's ready time of last_p's class moved, only
 * last_d's column (and the idle twin the scan gained, whose column is last_d's before the
 * commit) can differ; the best and its ties come from the kept columns in scan order, exactly
 * as plan_pair's scan finds them. Otherwise plan_pair. Same returns as plan_pair. */
static int plan_slot(Plan *W, Py_ssize_t i, Py_ssize_t *op, Py_ssize_t *od, double *obest) {
    int free_start = !W->any_full && W->kv[i] <= W->slack;
    if (W->ver[i] != W->commits - 1 || W->fsv[i] != free_start)
        return plan_pair(W, i, op, od, obest);
    Py_ssize_t K = W->K, P = W->P, D = W->D, ds = W->last_d, ks = W->cls[W->last_p];
    const double *pf = W->pf + i * P;
    double *ready = W->rdy + i * K, *colv = W->colv + i * D, *x = W->x + i * D * K;
    double *fp = W->fpv + i * P;
    char *xread = W->xread + i * D;
    fp[W->last_p] = W->free[W->last_p] + pf[W->last_p];
    Py_ssize_t j = W->mem_start[ks], stop = W->mem_start[ks + 1];
    double r = fp[W->mem[j]]; /* class_ready for class ks */
    for (j++; j < stop; j++) {
        double v = fp[W->mem[j]];
        if (v < r) r = v;
    }
    if (r != ready[ks]) return plan_pair(W, i, op, od, obest);
    W->ver[i] = -2;
    if (W->twin >= 0) {
        Py_ssize_t t = W->twin;
        colv[t] = colv[ds];
        if (xread[ds]) {
            memcpy(x + t * K, x + ds * K, sizeof(double) * (size_t)K);
            xread[t] = 1;
        }
    }
    if (!(W->kvt[i] > W->capacity[ds])) {
        double start, end;
        if (!xread[ds] && plan_read_x(W, i, ds) < 0) return -1;
        int rr = plan_start_end(W, i, ds, free_start, &start, &end);
        if (rr != 0) return rr < 0 ? -1 : 0;
        colv[ds] = column_value(K, ready, x + ds * K, start, end);
    }
    double best = INFINITY;
    Py_ssize_t ncols = 0;
    for (Py_ssize_t s = 0; s < W->nscan; s++) {
        Py_ssize_t d = W->scan[s];
        if (!(W->kvt[i] > W->capacity[d])) take_column(colv[d], d, &best, W->cols, &ncols);
    }
    *obest = best;
    if (best == INFINITY) return 0;
    for (Py_ssize_t c = 0; c < ncols; c++) { /* the tied columns' start and end, as resolved */
        Py_ssize_t d = W->cols[c];
        int rr = plan_start_end(W, i, d, free_start, &W->starts[d], &W->ends[d]);
        if (rr != 0) return rr < 0 ? -1 : 0;
    }
    if (resolve_ties(K, P, W->mem, W->mem_start, W->cls, fp, ready, x, W->cols, ncols,
                     W->starts, W->ends, best, W->reach, op, od) < 0)
        return -1;
    W->ver[i] = W->commits;
    return 1;
}

/* risk_plan(now, free, pf_members, pf_class, dec_kind, count, ctx, tokens, dec_static,
 *           batch_top, capacity, pfs, xcols, xfer, weights, own_ctxs, kvs, kv_trues,
 *           ctx_shares, arrival, h_est, slack, any_full, picked) -> [(slot, p, d, delta), ...]
 * The compiled twin of hexagent_gym.agents.hexagent's ranking of a prefill window under Ŝ, pick after pick:
 * the riskiest unpicked slot ((now - arrival) + its best Δ) / h_est (the first of equal risks;
 * with one slot left, that slot) at its best pair (Projections.best_prefill_pair_one_python),
 * then PlanState.commit's update of Ŝ (the prefill free time, the decode lists, the limits, the
 * scan). It stops early, returning the picks so far, where an exact answer needs what it does
 * not model: a decode limit that binds (the slow-start releases), a slot without a valid pair,
 * or a zero horizon or NaN risk. slack None: the limits (PlanState.limits) are derived from
 * the decode lists. */
static PyObject *risk_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 24, "risk_plan")) return NULL;
    PyObject *free = args[1], *members = args[2], *cls = args[3], *kind = args[4];
    PyObject *count = args[5], *ctx = args[6], *tokens = args[7], *dec_static = args[8];
    PyObject *capacity = args[10], *pfs = args[11], *xcols = args[12], *weights = args[14];
    PyObject *own = args[15], *kvs = args[16], *kvts = args[17], *shares = args[18];
    PyObject *arrival = args[19], *h_est = args[20], *picked = args[23];
    Plan W;
    W.block = NULL;
    W.now = num(args[0]);
    W.top = PyLong_AsSsize_t(args[9]);
    int derive = args[21] == Py_None; /* the limits are derived from Ŝ's lists (below) */
    W.slack = derive ? 0.0 : num(args[21]);
    W.any_full = derive ? 0 : PyObject_IsTrue(args[22]);
    W.dec_static = dec_static;
    if (PyErr_Occurred() || W.any_full < 0) return NULL;
    PyObject *seqs[] = {free, members, cls, kind, count, ctx, tokens, dec_static, capacity, pfs,
                        xcols, weights, own, kvs, kvts, shares, arrival, h_est, picked};
    const char *names[] = {"free", "pf_members", "pf_class", "dec_kind", "count", "ctx",
                           "tokens", "dec_static", "capacity", "pfs", "xcols", "weights",
                           "own_ctxs", "kvs", "kv_trues", "ctx_shares", "arrival", "h_est",
                           "picked"};
    for (int j = 0; j < 19; j++)
        if (!is_seq(seqs[j], names[j])) return NULL;
    Py_ssize_t n = Py_SIZE(pfs), P = Py_SIZE(free), D = Py_SIZE(capacity), K = Py_SIZE(members);
    W.n = n, W.P = P, W.D = D, W.K = K;
    if (Py_SIZE(cls) != P || Py_SIZE(kind) != D || Py_SIZE(count) != D || Py_SIZE(ctx) != D ||
        Py_SIZE(tokens) != D || Py_SIZE(dec_static) != D) {
        PyErr_SetString(PyExc_ValueError, "risk_plan: inconsistent sizes");
        return NULL;
    }
    for (int j = 9; j < 19; j++)
        if (Py_SIZE(seqs[j]) != n) {
            PyErr_SetString(PyExc_ValueError, "risk_plan: per-call lists differ in length");
            return NULL;
        }
    if (read_xfer(args[13], D, K, "risk_plan", &W.xfer) < 0) return NULL;
    size_t nd = (size_t)(P + 8 * D + n * P + n * D * K + 8 * n + K + 2 * D + 2 * D +
                         n * D + n * K + n * P);
    size_t ni = (size_t)(4 * D + 2 * P + K + 1 + D + K + D + n + D);
    W.block = PyMem_Malloc(sizeof(double) * nd + sizeof(Py_ssize_t) * ni +
                           (size_t)(n + n * D + D + n) + 1);
    if (W.block == NULL) return PyErr_NoMemory();
    double *f = W.block;
    W.free = f, f += P;
    W.tokens = f, f += D;
    W.ctx = f, f += D;
    W.bc = f, f += D;
    W.sl = f, f += D;
    W.cap = f, f += D;
    W.room = f, f += D;
    W.capacity = f, f += D;
    f += D; /* spare */
    W.pf = f, f += n * P;
    W.x = f, f += n * D * K;
    W.weight = f, f += n;
    W.own = f, f += n;
    W.kv = f, f += n;
    W.kvt = f, f += n;
    W.share = f, f += n;
    W.arr = f, f += n;
    W.h = f, f += n;
    W.len = f, f += n;
    W.ready = f, f += K;
    W.starts = f, f += D;
    W.ends = f, f += D;
    W.seen_val = f, f += 2 * D;
    W.colv = f, f += n * D;
    W.rdy = f, f += n * K;
    W.fpv = f, f += n * P;
    Py_ssize_t *ix = (Py_ssize_t *)(W.block) + nd; /* doubles and Py_ssize_t are both 8 bytes */
    W.cnt = ix, ix += D;
    W.maxb = ix, ix += D;
    W.kind = ix, ix += D;
    W.scan = ix, ix += D;
    W.cls = ix, ix += P;
    W.mem = ix, ix += P;
    W.mem_start = ix, ix += K + 1;
    W.cols = ix, ix += D;
    W.reach = ix, ix += K;
    W.seen_kind = ix, ix += D;
    W.ver = ix, ix += n;
    W.oscan = ix, ix += D;
    W.picked = (char *)ix;
    W.xread = W.picked + n;
    W.fresh = W.xread + n * D;
    W.fsv = W.fresh + D;
    memset(W.xread, 0, (size_t)(n * D + D));
    for (Py_ssize_t i = 0; i < n; i++) W.ver[i] = -2;
    W.commits = 0, W.last_p = W.last_d = W.twin = -1;
    W.xcols = xcols;
    PyObject *out = NULL;
    for (Py_ssize_t p = 0; p < P; p++) {
        W.free[p] = dat(free, p);
        W.cls[p] = iat(cls, p);
    }
    if (read_members(members, P, "risk_plan", W.mem, W.mem_start) < 0) goto fail;
    for (Py_ssize_t d = 0; d < D; d++) {
        PyObject *row = at(dec_static, d);
        if (!is_seq(row, "dec_static[d]")) goto fail;
        W.tokens[d] = dat(tokens, d);
        W.ctx[d] = dat(ctx, d);
        W.cnt[d] = iat(count, d);
        W.kind[d] = iat(kind, d);
        W.cap[d] = dat(row, 0);
        W.maxb[d] = iat(row, 1);
        W.capacity[d] = dat(capacity, d);
        if (derive) { /* PlanState.limits, as decode_limits computes them */
            double room = W.capacity[d] - W.tokens[d];
            if (d == 0 || room < W.slack) W.slack = room;
            W.any_full |= W.cnt[d] >= W.maxb[d];
        }
    }
    Py_ssize_t remaining = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pf = at(pfs, i), *xc = at(xcols, i);
        double L = W.len[i] = xcols_tokens(xc, W.xfer, "risk_plan");
        if (L == -2.0 || !is_seq(pf, "pf") || (L < 0.0 && !is_seq(xc, "xcols"))) goto fail;
        if (Py_SIZE(pf) != P || (L < 0.0 && Py_SIZE(xc) != D)) {
            PyErr_SetString(PyExc_ValueError, "risk_plan: a call's pf or xcols has the wrong size");
            goto fail;
        }
        for (Py_ssize_t p = 0; p < P; p++) W.pf[i * P + p] = dat(pf, p);
        W.weight[i] = dat(weights, i), W.own[i] = dat(own, i), W.kv[i] = dat(kvs, i);
        W.kvt[i] = dat(kvts, i), W.share[i] = dat(shares, i), W.arr[i] = dat(arrival, i);
        W.h[i] = dat(h_est, i);
        int was = PyObject_IsTrue(at(picked, i));
        if (was < 0) goto fail;
        W.picked[i] = (char)was;
        remaining += !was;
    }
    if (PyErr_Occurred()) goto fail;
    plan_scan(&W);
    out = PyList_New(0);
    if (out == NULL) goto fail;
    while (remaining > 0) {
        Py_ssize_t slot = -1, p = 0, d = 0, bp = 0, bd = 0;
        double best = INFINITY, top = -INFINITY;
        int ok = 1;
        if (remaining == 1) {
            for (Py_ssize_t i = 0; i < n; i++)
                if (!W.picked[i]) slot = i;
            int r = plan_slot(&W, slot, &p, &d, &best);
            if (r < 0) goto fail;
            ok = r;
        } else {
            for (Py_ssize_t i = 0; i < n && ok; i++) {
                if (W.picked[i]) continue;
                double b;
                Py_ssize_t pi = 0, di = 0;
                int r = plan_slot(&W, i, &pi, &di, &b);
                if (r < 0) goto fail;
                if (r == 0 || W.h[i] == 0.0) {
                    ok = 0;
                    break;
                }
                double risk = ((W.now - W.arr[i]) + b) / W.h[i];
                if (risk != risk) {
                    ok = 0;
                    break;
                }
                if (risk > top) top = risk, slot = i, bp = pi, bd = di, best = b;
            }
            p = bp, d = bd;
            if (slot < 0) ok = 0;
        }
        if (!ok) break;
        PyObject *t = Py_BuildValue("nnnd", slot, p, d, best);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
        /* PlanState.commit at the prefill stage */
        int was_idle = W.cnt[d] == 0 && W.tokens[d] <= 0.0;
        W.free[p] += W.pf[slot * P + p];
        W.tokens[d] += W.kv[slot];
        W.cnt[d] += 1;
        W.ctx[d] += W.share[slot];
        double s2 = W.capacity[d] - W.tokens[d];
        W.slack = s2 < W.slack ? s2 : W.slack;
        W.any_full = W.any_full || W.cnt[d] >= W.maxb[d];
        W.fresh[d] = 0;
        W.commits++, W.last_p = p, W.last_d = d, W.twin = -1;
        if (was_idle) {
            Py_ssize_t old = W.nscan, a = 0;
            memcpy(W.oscan, W.scan, sizeof(Py_ssize_t) * (size_t)old);
            plan_scan(&W);
            /* the scan keeps every instance it had (d is busy now) and may gain d's first idle
             * twin; anything else (not expected) and every slot's answer is recomputed */
            for (Py_ssize_t b = 0; b < W.nscan; b++) {
                if (a < old && W.oscan[a] == W.scan[b]) a++;
                else if (W.twin < 0) W.twin = W.scan[b];
                else W.commits++;
            }
            if (a != old) W.commits++;
        }
        W.picked[slot] = 1;
        remaining--;
    }
    PyMem_Free(W.block);
    return out;
fail:
    Py_XDECREF(out);
    PyMem_Free(W.block);
    return NULL;
}

/* match_levels(holders, blocks) -> [(k, mask), ...] or None
 * prefix_cache.match_levels_python for caches whose bit masks fit in 64 bits (None when a mask
 * does not: the caller runs the Python version): holders maps a block id to the mask of the
 * caches holding it; each (k, mask) says the caches in mask match exactly k leading blocks. */
static int append_level(PyObject *levels, unsigned long long k, unsigned long long mask) {
    PyObject *t = Py_BuildValue("(KK)", k, mask);
    if (t == NULL || PyList_Append(levels, t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    Py_DECREF(t);
    return 0;
}

static PyObject *match_levels(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 2, "match_levels")) return NULL;
    PyObject *holders = args[0], *blocks = args[1];
    if (!PyDict_CheckExact(holders)) {
        PyErr_Format(PyExc_TypeError, "holders must be a dict, got %s", Py_TYPE(holders)->tp_name);
        return NULL;
    }
    if (!is_seq(blocks, "blocks")) return NULL;
    PyObject *levels = PyList_New(0);
    if (levels == NULL) return NULL;
    unsigned long long alive = ~0ULL, k = 0; /* all bits: Python's -1 before the first block */
    Py_ssize_t nb = Py_SIZE(blocks);
    for (Py_ssize_t j = 0; j < nb; j++) {
        PyObject *v = PyDict_GetItemWithError(holders, at(blocks, j));
        unsigned long long mask = 0;
        if (v == NULL) {
            if (PyErr_Occurred()) goto fail;
        } else {
            /* a mask of 64 bits or fewer, read digit by digit (PyLong_AsUnsignedLongLong takes
             * a byte-by-byte path for every multi-digit int: masks of caches 30 and up) */
            if (!PyLong_Check(v) || _PyLong_Sign(v) < 0) goto wide;
            size_t bits = _PyLong_NumBits(v);
            if (bits == (size_t)-1 && PyErr_Occurred()) goto fail;
            if (bits > 64) goto wide;
            mask = PyLong_AsUnsignedLongLongMask(v);
            if (mask == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        }
        unsigned long long now = alive & mask;
        if (now != alive && k && append_level(levels, k, alive & ~now) < 0) goto fail;
        alive = now;
        if (!alive) return levels;
        k++;
    }
    if (k && append_level(levels, k, alive) < 0) goto fail;
    return levels;
wide: /* a mask wider than 64 bits (or not a mask): the Python version answers */
    Py_DECREF(levels);
    Py_RETURN_NONE;
fail:
    Py_DECREF(levels);
    return NULL;
}

/* decode_cells(out, slots, rows, cols, weights, own_ctxs, now, count, ctx, dec_static,
 *              batch_top) -> None
 * Projections.decode_delta_one for decode-stage calls that no decode limit binds (they start
 * now on their own instance, which therefore cannot refuse them, so they do not move): each
 * out[slots[j], rows[j], cols[j]] (float64, C-contiguous n x P x D) = now + decode_end, that
 * is now + (weights[j] * ((base + slope * ctx[d]) + slope * own_ctxs[j]) - now) with d's terms
 * at its committed count (dec_static[d] = (capacity, max_batch, base_row, slope_row)). */
static PyObject *decode_cells(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 11, "decode_cells")) return NULL;
    PyObject *slots = args[1], *rows = args[2], *cols = args[3], *weights = args[4];
    PyObject *owns = args[5], *count = args[7], *ctx = args[8], *dec_static = args[9];
    if (!is_seq(slots, "slots") || !is_seq(rows, "rows") || !is_seq(cols, "cols") ||
        !is_seq(weights, "weights") || !is_seq(owns, "own_ctxs") || !is_seq(count, "count") ||
        !is_seq(ctx, "ctx") || !is_seq(dec_static, "dec_static"))
        return NULL;
    Py_ssize_t m = Py_SIZE(slots), D = Py_SIZE(dec_static);
    if (Py_SIZE(rows) != m || Py_SIZE(cols) != m || Py_SIZE(weights) != m || Py_SIZE(owns) != m ||
        Py_SIZE(count) != D || Py_SIZE(ctx) != D) {
        PyErr_SetString(PyExc_ValueError, "decode_cells: slots, rows, cols, weights and own_ctxs "
                        "need one entry per cell; count and ctx one per decode instance");
        return NULL;
    }
    double now = num(args[6]);
    Py_ssize_t top = PyLong_AsSsize_t(args[10]);
    if (PyErr_Occurred()) return NULL;
    PyObject *o = args[0];
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != NPY_DOUBLE ||
        PyArray_NDIM((PyArrayObject *)o) != 3 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)o) || PyArray_DIM((PyArrayObject *)o, 2) != D) {
        PyErr_Format(PyExc_TypeError, "decode_cells: out must be a writable C-contiguous float64 "
                     "array n x P x %zd", D);
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)o;
    Py_ssize_t n = PyArray_DIM(out, 0), P = PyArray_DIM(out, 1);
    double *grid = PyArray_DATA(out);
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t i = iat(slots, j), p = iat(rows, j), d = iat(cols, j);
        if (PyErr_Occurred()) return NULL;
        if (i < 0 || i >= n || p < 0 || p >= P || d < 0 || d >= D) {
            PyErr_Format(PyExc_IndexError, "decode_cells: cell (%zd, %zd, %zd) is outside out "
                         "(%zd x %zd x %zd)", i, p, d, n, P, D);
            return NULL;
        }
        PyObject *row = at(dec_static, d);
        if (!is_seq(row, "dec_static[d]")) return NULL;
        double bc, sl;
        if (row_terms(row, iat(count, d), top, dat(ctx, d), &bc, &sl) < 0) return NULL;
        double end = dat(weights, j) * (bc + sl * dat(owns, j)) - now;
        if (PyErr_Occurred()) return NULL;
        grid[(i * P + p) * D + d] = now + end;
    }
    Py_RETURN_NONE;
}

/* standalone_estimate(pf_est, l_in, l_out, dec_err, dec_base, dec_slope, pair_p, setup, spt)
 * -> float: ClusterTables.standalone_estimate_python (a call's duration alone on the empty
 * cluster at its best class pair): dec_base and dec_slope per decode class (J), pair_p the
 * representative prefill instance of each prefill class (K), setup and spt the K·J transfer
 * terms row by row (class k's row for decode class j at k·J + j). */
static PyObject *standalone_estimate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 9, "standalone_estimate")) return NULL;
    PyObject *pf = args[0], *base = args[4], *slope = args[5], *pair_p = args[6];
    PyObject *setup = args[7], *spt = args[8];
    if (!is_seq(pf, "pf_est") || !is_seq(base, "dec_base") || !is_seq(slope, "dec_slope") ||
        !is_seq(pair_p, "pair_p") || !is_seq(setup, "setup") || !is_seq(spt, "spt"))
        return NULL;
    double l_in = num(args[1]), l_out = num(args[2]), err = num(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t J = Py_SIZE(base), K = Py_SIZE(pair_p), P = Py_SIZE(pf);
    if (J > 64 || Py_SIZE(slope) != J || Py_SIZE(setup) != K * J || Py_SIZE(spt) != K * J) {
        PyErr_SetString(PyExc_ValueError, "standalone_estimate: dec_base and dec_slope need one "
                        "entry per decode class (at most 64), setup and spt K·J");
        return NULL;
    }
    double ctx = l_in + 0.5 * (l_out - 1.0); /* mean_own_context */
    double dec[64];
    for (Py_ssize_t j = 0; j < J; j++)
        dec[j] = l_out * (dat(base, j) + dat(slope, j) * ctx) * err;
    double best = INFINITY;
    for (Py_ssize_t k = 0; k < K; k++) {
        Py_ssize_t p = iat(pair_p, k);
        if (PyErr_Occurred()) return NULL;
        if (p < 0 || p >= P) {
            PyErr_Format(PyExc_IndexError, "standalone_estimate: pair_p[%zd] = %zd is outside "
                         "pf_est (%zd instances)", k, p, P);
            return NULL;
        }
        double f = dat(pf, p);
        for (Py_ssize_t j = 0; j < J; j++) {
            double v = f + dat(setup, k * J + j) + l_in * dat(spt, k * J + j) + dec[j];
            if (v < best) best = v;
        }
    }
    if (PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(best);
}

/* The prefix cache's block bookkeeping (prefix_cache.PrefixCache's lock, insert and unlock):
 * lru is the cache's OrderedDict of block ids (written only through the generic mapping
 * protocol, so its order list stays consistent), refs the plain dict of lock counts, holders the
 * cluster's plain dict of holder bit masks (or None), touch lru.move_to_end. */
static int is_dict(PyObject *o, const char *fn, const char *name, int exact) {
    if (exact ? PyDict_CheckExact(o) : PyDict_Check(o)) return 1;
    PyErr_Format(PyExc_TypeError, "%s: %s must be a dict, got %s", fn, name, Py_TYPE(o)->tp_name);
    return 0;
}

static int add_ref(PyObject *refs, PyObject *b) { /* refs[b] = refs.get(b, 0) + 1 */
    PyObject *v = PyDict_GetItemWithError(refs, b);
    long n = 0;
    if (v != NULL) {
        n = PyLong_AsLong(v);
        if (n == -1 && PyErr_Occurred()) return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *w = PyLong_FromLong(n + 1);
    if (w == NULL) return -1;
    int rc = PyDict_SetItem(refs, b, w);
    Py_DECREF(w);
    return rc;
}

static int touch_block(PyObject *touch, PyObject *b) { /* lru.move_to_end(b) */
    PyObject *r = PyObject_CallOneArg(touch, b);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* cache_lock(lru, refs, touch, blocks, k) -> k: PrefixCache.lock (k < 0: match first; touch
 * None: no touch). */
static PyObject *cache_lock(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 5, "cache_lock")) return NULL;
    PyObject *lru = args[0], *refs = args[1], *touch = args[2], *blocks = args[3];
    if (!is_dict(lru, "cache_lock", "lru", 0)) return NULL; /* the cache's OrderedDict */
    if (!is_dict(refs, "cache_lock", "refs", 1) || !is_seq(blocks, "blocks")) return NULL;
    Py_ssize_t k = PyLong_AsSsize_t(args[4]), n = Py_SIZE(blocks);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k > n) {
        PyErr_Format(PyExc_ValueError, "cache_lock: k = %zd exceeds the %zd blocks", k, n);
        return NULL;
    }
    if (k < 0) { /* PrefixCache.match: leading blocks present */
        k = 0;
        while (k < n) {
            int in = PyDict_Contains(lru, at(blocks, k));
            if (in < 0) return NULL;
            if (!in) break;
            k++;
        }
    }
    for (Py_ssize_t i = k - 1; i >= 0; i--) { /* leaf first: parents end up more recent */
        PyObject *b = at(blocks, i);
        if (touch != Py_None && touch_block(touch, b) < 0) return NULL;
        if (add_ref(refs, b) < 0) return NULL;
    }
    return PyLong_FromSsize_t(k);
}

/* cache_insert(lru, refs, holders, bit, blocks, start, capacity, touch) -> (end, added, full):
 * PrefixCache.insert from blocks[start] on, up to the first block that needs an eviction
 * (full: the caller evicts one block and calls again from end, or touches blocks[:end] itself
 * when nothing can go); not full: every block inserted and blocks[:end] touched leaf first.
 * capacity: blocks the cache may hold, None for unbounded; added: blocks newly inserted. */
static PyObject *cache_insert(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 8, "cache_insert")) return NULL;
    PyObject *lru = args[0], *refs = args[1], *holders = args[2], *bit = args[3];
    PyObject *blocks = args[4], *touch = args[7];
    if (!is_dict(lru, "cache_insert", "lru", 0)) return NULL; /* the cache's OrderedDict */
    if (!is_dict(refs, "cache_insert", "refs", 1) || !is_seq(blocks, "blocks")) return NULL;
    if (holders != Py_None && !is_dict(holders, "cache_insert", "holders", 1)) return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[5]), n = Py_SIZE(blocks), cap = -1;
    if (end == -1 && PyErr_Occurred()) return NULL;
    if (args[6] != Py_None) {
        cap = PyLong_AsSsize_t(args[6]);
        if (cap == -1 && PyErr_Occurred()) return NULL;
    }
    if (end < 0 || end > n) {
        PyErr_Format(PyExc_ValueError, "cache_insert: start = %zd is outside 0..%zd", end, n);
        return NULL;
    }
    Py_ssize_t added = 0;
    for (; end < n; end++) {
        PyObject *b = at(blocks, end);
        int in = PyDict_Contains(lru, b);
        if (in < 0) return NULL;
        if (!in) {
            if (cap >= 0 && PyObject_Length(lru) >= cap)
                return Py_BuildValue("(nnO)", end, added, Py_True);
            if (PyObject_SetItem(lru, b, Py_None) < 0) return NULL;
            added++;
            if (holders != Py_None) { /* holders[b] = holders.get(b, 0) | bit */
                PyObject *h = PyDict_GetItemWithError(holders, b), *zero = NULL;
                if (h == NULL) {
                    if (PyErr_Occurred()) return NULL;
                    h = zero = PyLong_FromLong(0);
                    if (zero == NULL) return NULL;
                }
                PyObject *w = PyNumber_Or(h, bit);
                Py_XDECREF(zero);
                if (w == NULL) return NULL;
                int rc = PyDict_SetItem(holders, b, w);
                Py_DECREF(w);
                if (rc < 0) return NULL;
            }
        }
        if (add_ref(refs, b) < 0) return NULL; /* locked at once: no eviction may take it */
    }
    for (Py_ssize_t i = end - 1; i >= 0; i--)
        if (touch_block(touch, at(blocks, i)) < 0) return NULL;
    return Py_BuildValue("(nnO)", end, added, Py_False);
}

/* cache_unlock(refs, blocks, k) -> None: PrefixCache.unlock (KeyError for a block not
 * locked). */
static PyObject *cache_unlock(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 3, "cache_unlock")) return NULL;
    PyObject *refs = args[0], *blocks = args[1];
    if (!is_dict(refs, "cache_unlock", "refs", 1) || !is_seq(blocks, "blocks")) return NULL;
    Py_ssize_t k = PyLong_AsSsize_t(args[2]);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k < 0 || k > Py_SIZE(blocks)) {
        PyErr_Format(PyExc_ValueError, "cache_unlock: k = %zd is outside 0..%zd", k,
                     Py_SIZE(blocks));
        return NULL;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *b = at(blocks, i);
        PyObject *v = PyDict_GetItemWithError(refs, b);
        if (v == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, b);
            return NULL;
        }
        long left = PyLong_AsLong(v);
        if (left == -1 && PyErr_Occurred()) return NULL;
        left -= 1;
        if (left) {
            PyObject *w = PyLong_FromLong(left);
            if (w == NULL) return NULL;
            int rc = PyDict_SetItem(refs, b, w);
            Py_DECREF(w);
            if (rc < 0) return NULL;
        } else if (PyDict_DelItem(refs, b) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* earliest_pair(now, free, pf_members, dec_static, batch_top, capacity, setup, spt, scan, tokens,
 *               count, ctx, slow_start, pf, cached, xcols, l_in, weight, own_ctx, kv_pred,
 *               kv_true) -> (p, d, delta)
 * placement.earliest_pair_python for one call (its prefill seconds pf: per class without a cache
 * view, per instance with one; cached: the view's hits per instance or None; xcols: the prompt's
 * transfer columns per (decode instance, class) when cached is None; weight and own_ctx its
 * decode inputs). Candidates: without hits the least-loaded member of each class (lowest index
 * on ties); with hits every instance holding some, then each class's least-loaded member
 * holding none. Per decode instance of the scan that can hold the call: the candidate whose KV
 * arrives first (lowest index on ties), then the earliest finish (lowest d on ties). */
static PyObject *earliest_pair(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 21, "earliest_pair")) return NULL;
    double now = num(args[0]);
    PyObject *free = args[1], *members = args[2], *dec_static = args[3];
    Py_ssize_t top = PyLong_AsSsize_t(args[4]);
    PyObject *capacity = args[5], *setup = args[6], *spt = args[7], *scan = args[8];
    PyObject *tokens = args[9], *count = args[10], *ctx = args[11], *slow_start = args[12];
    PyObject *pf = args[13], *cached = args[14], *xcols = args[15];
    double l_in = num(args[16]), weight = num(args[17]), own_ctx = num(args[18]);
    double kv = num(args[19]), kv_true = num(args[20]);
    if (PyErr_Occurred()) return NULL;
    if (!is_seq(free, "free") || !is_seq(members, "pf_members") ||
        !is_seq(dec_static, "dec_static") || !is_seq(capacity, "capacity") ||
        !is_seq(setup, "setup") || !is_seq(spt, "spt") || !is_seq(scan, "scan") ||
        !is_seq(tokens, "tokens") || !is_seq(count, "count") || !is_seq(ctx, "ctx") ||
        !is_seq(pf, "pf"))
        return NULL;
    int with_hits = cached != Py_None;
    if ((with_hits && !is_seq(cached, "cached")) || (!with_hits && !is_seq(xcols, "xcols")))
        return NULL;
    Py_ssize_t P = Py_SIZE(free), D = Py_SIZE(capacity), K = Py_SIZE(members);
    if (Py_SIZE(dec_static) != D || Py_SIZE(tokens) != D || Py_SIZE(count) != D ||
        Py_SIZE(ctx) != D || Py_SIZE(setup) != P || Py_SIZE(spt) != P ||
        Py_SIZE(pf) != (with_hits ? P : K) || (with_hits && Py_SIZE(cached) != P) ||
        (!with_hits && Py_SIZE(xcols) != D)) {
        PyErr_SetString(PyExc_ValueError, "earliest_pair: inconsistent sizes");
        return NULL;
    }
    /* candidates: (KV-ready base value, instance) in the Python rule's order */
    double *val = PyMem_Malloc(sizeof(double) * (size_t)P + 1);
    Py_ssize_t *cand = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)P + 1);
    PyObject *result = NULL;
    if (val == NULL || cand == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t nc = 0;
    for (Py_ssize_t k = 0; k < K; k++) {
        PyObject *m = at(members, k);
        if (!is_seq(m, "pf_members[k]")) goto done;
        Py_ssize_t nm = Py_SIZE(m);
        if (nm < 1) {
            PyErr_SetString(PyExc_ValueError, "earliest_pair: an empty prefill class");
            goto done;
        }
        if (!with_hits) {
            Py_ssize_t bp = iat(m, 0);
            if (bp < 0 || bp >= P) goto bad_member;
            double bf = dat(free, bp);
            for (Py_ssize_t j = 1; j < nm; j++) {
                Py_ssize_t p = iat(m, j);
                if (p < 0 || p >= P) goto bad_member;
                double f = dat(free, p);
                if (f < bf) bp = p, bf = f;
            }
            val[nc] = bf + dat(pf, k), cand[nc++] = bp;
        } else {
            Py_ssize_t bp = -1;
            double bf = INFINITY;
            for (Py_ssize_t j = 0; j < nm; j++) {
                Py_ssize_t p = iat(m, j);
                if (p < 0 || p >= P) goto bad_member;
                int hit = PyObject_IsTrue(at(cached, p));
                if (hit < 0) goto done;
                if (hit) {
                    val[nc] = dat(free, p) + dat(pf, p), cand[nc++] = p;
                } else {
                    double f = dat(free, p);
                    if (f < bf) bp = p, bf = f;
                }
            }
            if (bp >= 0) val[nc] = bf + dat(pf, bp), cand[nc++] = bp;
        }
        if (nc > P) goto bad_member;
    }
    if (PyErr_Occurred()) goto done;
    double best = INFINITY;
    Py_ssize_t best_d = -1, best_p = -1, nscan = Py_SIZE(scan);
    for (Py_ssize_t s = 0; s < nscan; s++) {
        Py_ssize_t d = iat(scan, s);
        if (d < 0 || d >= D) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "earliest_pair: scan %zd", d);
            goto done;
        }
        if (kv_true > dat(capacity, d)) continue;
        PyObject *row = at(dec_static, d); /* (capacity, max_batch, base_row, slope_row) */
        if (!is_seq(row, "dec_static[d]")) goto done;
        double cap = dat(row, 0), bc, sl, start, end;
        Py_ssize_t n = iat(count, d);
        if (row_terms(row, n, top, dat(ctx, d), &bc, &sl) < 0) goto done;
        if (start_end(now, bc, sl, cap, cap - dat(tokens, d), n, iat(row, 1), weight, own_ctx, kv,
                      0, slow_start, d, &start, &end) < 0 || PyErr_Occurred())
            goto done;
        double a = INFINITY;
        Py_ssize_t ap = -1;
        PyObject *xd = with_hits ? NULL : at(xcols, d);
        if (xd != NULL && (!is_seq(xd, "xcols[d]") || Py_SIZE(xd) != nc)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "earliest_pair: xcols rows need one entry "
                                "per prefill class");
            goto done;
        }
        for (Py_ssize_t c = 0; c < nc; c++) {
            Py_ssize_t p = cand[c];
            double x = with_hits ? dat(at(setup, p), d) + l_in * dat(at(spt, p), d) : dat(xd, c);
            x = val[c] + x; /* KV arrival on d; earliest wins, lowest prefill index on ties */
            if (x < a || (x == a && p < ap)) a = x, ap = p;
        }
        if (PyErr_Occurred()) goto done;
        double fin = (a > start ? a : start) + end;
        if (fin < best) best = fin, best_d = d, best_p = ap;
    }
    result = Py_BuildValue("nnd", best_p, best_d, best);
    goto done;
bad_member:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "earliest_pair: pf_members must split the instances");
done:
    PyMem_Free(val);
    PyMem_Free(cand);
    return result;
}

/* decode_scan(kind, tokens, count, ctx) -> [d, ...]
 * hexagent_gym.planning.placement.decode_scan_python: every decode instance holding a committed call or
 * committed tokens, and of each set of idle twins (equal kind, tokens and context) the first. */
static PyObject *decode_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *const names[4] = {"kind", "tokens", "count", "ctx"};
    Py_ssize_t D;
    if (four_lists(args, nargs, "decode_scan", names, &D) < 0) return NULL;
    PyObject *kind = args[0], *tokens = args[1], *count = args[2], *ctx = args[3];
    /* the lists as arrays, then the scan over them (seen_*: idle_scan's sets) */
    double *vals = PyMem_Malloc(sizeof(double) * (size_t)(4 * D) + 1);
    Py_ssize_t *ints = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(4 * D) + 1);
    PyObject *out = NULL;
    if (vals == NULL || ints == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double *tk = vals, *cx = vals + D, *seen_val = vals + 2 * D;
    Py_ssize_t *kd = ints, *cnt = ints + D, *seen_kind = ints + 2 * D, *scan = ints + 3 * D;
    for (Py_ssize_t d = 0; d < D; d++) {
        kd[d] = iat(kind, d), cnt[d] = iat(count, d);
        tk[d] = dat(tokens, d), cx[d] = dat(ctx, d);
    }
    if (PyErr_Occurred()) goto done;
    Py_ssize_t ns = idle_scan(D, kd, tk, cnt, cx, seen_kind, seen_val, scan);
    out = PyList_New(ns);
    if (out == NULL) goto done;
    for (Py_ssize_t j = 0; j < ns; j++) {
        PyObject *v = PyLong_FromSsize_t(scan[j]);
        if (v == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, j, v);
    }
done:
    PyMem_Free(vals);
    PyMem_Free(ints);
    return out;
}

/* prefill_free_times(run_end, now, queued) -> [float, ...]
 * hexagent_gym.planning.entities.prefill_free_times_python: (end if end > now else now) + (q if q > 0 else
 * 0) per prefill instance. */
static PyObject *prefill_free_times(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 3, "prefill_free_times")) return NULL;
    PyObject *run_end = args[0], *queued = args[2];
    double now = num(args[1]);
    if (PyErr_Occurred() || !is_seq(run_end, "run_end") || !is_seq(queued, "queued"))
        return NULL;
    Py_ssize_t P = Py_SIZE(run_end);
    if (Py_SIZE(queued) != P) {
        PyErr_SetString(PyExc_ValueError, "prefill_free_times: inconsistent sizes");
        return NULL;
    }
    PyObject *out = PyList_New(P);
    if (out == NULL) return NULL;
    for (Py_ssize_t p = 0; p < P; p++) {
        PyObject *end_obj = at(run_end, p);
        double end = num(end_obj), q = dat(queued, p);
        double v = (end > now ? end : now) + (q > 0.0 ? q : 0.0);
        /* an instance with nothing queued is free at its run end or now: that float object
         * itself when it holds the same bits (most instances of a large cluster), not a new
         * one to allocate here and free after the decision */
        PyObject *same = q > 0.0 ? NULL : end > now ? end_obj : args[1];
        PyObject *item;
        if (PyErr_Occurred()) item = NULL;
        else if (same != NULL && PyFloat_CheckExact(same) &&
                 memcmp(&((PyFloatObject *)same)->ob_fval, &v, sizeof v) == 0)
            item = Py_NewRef(same);
        else item = PyFloat_FromDouble(v);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, p, item);
    }
    return out;
}

/* a + b as Python's a + b: the float sum of two floats here, any other pair by the generic
 * number protocol (an int plus an int stays an int, as in the Python rule). */
static inline PyObject *num_add(PyObject *a, PyObject *b) {
    if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b))
        return PyFloat_FromDouble(PyFloat_AS_DOUBLE(a) + PyFloat_AS_DOUBLE(b));
    return PyNumber_Add(a, b);
}

/* lst[i] = lst[i] + b (lst a list, i in range); 0, or -1 with an exception. */
static int list_add(PyObject *lst, Py_ssize_t i, PyObject *b) {
    PyObject *v = num_add(PyList_GET_ITEM(lst, i), b);
    if (v == NULL) return -1;
    PyObject *old = PyList_GET_ITEM(lst, i);
    PyList_SET_ITEM(lst, i, v);
    Py_DECREF(old);
    return 0;
}

/* commit_prefill_picks(picks, cache_aware, free, pf_tokens, tokens, count, ctx, log, now,
 *                      capacity, max_batch, scan_kept, limits) -> (scan_kept, limits)
 * The loop of PlanState.commit_prefill_picks (its path without numpy twins, release lists or a
 * step-time cache), pick by pick with the same Python objects and operations: for each
 * (call, p, d, delta) of picks, free[p] += (call.pf_est if cache_aware else call.pf_cold)[p],
 * pf_tokens[p] += call.l_in; scan_kept becomes False when d was idle (count[d] == 0 and
 * tokens[d] <= 0); tokens[d] += call.kv_pred, count[d] += 1, ctx[d] += call.ctx_share; limits
 * (None, or the pair (slack, any_full)) becomes (min(slack, capacity[d] - tokens[d]), any_full
 * or count[d] >= max_batch[d]) as the Python expression picks its objects; log gains
 * (d, now + delta, float(call.kv_pred)). free, pf_tokens, tokens, count, ctx and log are lists,
 * updated in place. */
static PyObject *commit_prefill_picks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 13, "commit_prefill_picks")) return NULL;
    PyObject *picks = args[0], *free = args[2], *pf_tokens = args[3], *tokens = args[4];
    PyObject *count = args[5], *ctx = args[6], *log = args[7], *now = args[8];
    PyObject *capacity = args[9], *max_batch = args[10];
    int cache_aware = PyObject_IsTrue(args[1]), scan_kept = PyObject_IsTrue(args[11]);
    if (cache_aware < 0 || scan_kept < 0) return NULL;
    PyObject *const lists[6] = {free, pf_tokens, tokens, count, ctx, log};
    const char *const names[6] = {"free", "pf_tokens", "tokens", "count", "ctx", "log"};
    for (int j = 0; j < 6; j++)
        if (!PyList_CheckExact(lists[j])) {
            PyErr_Format(PyExc_TypeError, "commit_prefill_picks: %s must be a list, got %s",
                         names[j], Py_TYPE(lists[j])->tp_name);
            return NULL;
        }
    if (!is_seq(picks, "picks") || !is_seq(capacity, "capacity") ||
        !is_seq(max_batch, "max_batch"))
        return NULL;
    Py_ssize_t P = PyList_GET_SIZE(free), D = PyList_GET_SIZE(tokens);
    if (PyList_GET_SIZE(pf_tokens) != P || PyList_GET_SIZE(count) != D ||
        PyList_GET_SIZE(ctx) != D || Py_SIZE(capacity) != D || Py_SIZE(max_batch) != D) {
        PyErr_SetString(PyExc_ValueError, "commit_prefill_picks: inconsistent sizes");
        return NULL;
    }
    PyObject *limits = args[12];
    if (limits != Py_None && !(PyTuple_CheckExact(limits) && PyTuple_GET_SIZE(limits) == 2)) {
        PyErr_SetString(PyExc_TypeError, "commit_prefill_picks: limits must be None or a pair");
        return NULL;
    }
    Py_INCREF(limits);
    PyObject *one = PyLong_FromLong(1), *zero = PyFloat_FromDouble(0.0);
    if (one == NULL || zero == NULL) goto fail;
    for (Py_ssize_t i = 0; i < Py_SIZE(picks); i++) {
        PyObject *pick = at(picks, i);
        if (!PyTuple_CheckExact(pick) || PyTuple_GET_SIZE(pick) != 4) {
            PyErr_SetString(PyExc_TypeError,
                            "commit_prefill_picks: a pick must be a tuple (call, p, d, delta)");
            goto fail;
        }
        PyObject *call = PyTuple_GET_ITEM(pick, 0), *d_obj = PyTuple_GET_ITEM(pick, 2);
        Py_ssize_t p = as_ssize(PyTuple_GET_ITEM(pick, 1)), d = as_ssize(d_obj);
        if (PyErr_Occurred()) goto fail;
        if (p < 0 || p >= P || d < 0 || d >= D) {
            PyErr_Format(PyExc_IndexError, "commit_prefill_picks: pick (p=%zd, d=%zd) outside "
                         "%zd prefill and %zd decode instances", p, d, P, D);
            goto fail;
        }
        /* free[p] += pf[p]; pf_tokens[p] += call.l_in */
        PyObject *pf = attr(call, cache_aware ? A_PF_EST : A_PF_COLD);
        if (pf == NULL) goto fail;
        PyObject *pf_p = PySequence_GetItem(pf, p);
        Py_DECREF(pf);
        if (pf_p == NULL) goto fail;
        int rc = list_add(free, p, pf_p);
        Py_DECREF(pf_p);
        PyObject *v = rc < 0 ? NULL : attr(call, A_L_IN);
        if (v == NULL) goto fail;
        rc = list_add(pf_tokens, p, v);
        Py_DECREF(v);
        if (rc < 0) goto fail;
        /* d idle (no call, no tokens): it leaves its twins, the scan is rebuilt */
        if (scan_kept) {
            int busy = PyObject_IsTrue(PyList_GET_ITEM(count, d));
            if (busy < 0) goto fail;
            if (!busy) {
                int empty = PyObject_RichCompareBool(PyList_GET_ITEM(tokens, d), zero, Py_LE);
                if (empty < 0) goto fail;
                if (empty) scan_kept = 0;
            }
        }
        /* the decode lists */
        PyObject *kv = attr(call, A_KV_PRED);
        if (kv == NULL) goto fail;
        if (list_add(tokens, d, kv) < 0 || list_add(count, d, one) < 0 ||
            (v = attr(call, A_CTX_SHARE)) == NULL) {
            Py_DECREF(kv);
            goto fail;
        }
        rc = list_add(ctx, d, v);
        Py_DECREF(v);
        if (rc < 0) {
            Py_DECREF(kv);
            goto fail;
        }
        /* limits = (slack if slack < limits[0] else limits[0], limits[1] or count[d] >= mb[d]) */
        if (limits != Py_None) {
            PyObject *slack = PyNumber_Subtract(at(capacity, d), PyList_GET_ITEM(tokens, d));
            if (slack == NULL) {
                Py_DECREF(kv);
                goto fail;
            }
            PyObject *low = PyTuple_GET_ITEM(limits, 0), *full = PyTuple_GET_ITEM(limits, 1);
            int below = PyObject_RichCompareBool(slack, low, Py_LT);
            int was_full = below < 0 ? -1 : PyObject_IsTrue(full);
            PyObject *now_full = was_full < 0 ? NULL : was_full ? Py_NewRef(full)
                : PyObject_RichCompare(PyList_GET_ITEM(count, d), at(max_batch, d), Py_GE);
            PyObject *next = now_full == NULL ? NULL
                : PyTuple_Pack(2, below ? slack : low, now_full);
            Py_DECREF(slack);
            Py_XDECREF(now_full);
            if (next == NULL) {
                Py_DECREF(kv);
                goto fail;
            }
            Py_SETREF(limits, next);
        }
        /* log.append((d, now + delta, float(kv))) */
        PyObject *when = num_add(now, PyTuple_GET_ITEM(pick, 3));
        PyObject *kvf = PyNumber_Float(kv);
        Py_DECREF(kv);
        PyObject *entry = when == NULL || kvf == NULL ? NULL : PyTuple_Pack(3, d_obj, when, kvf);
        Py_XDECREF(when);
        Py_XDECREF(kvf);
        if (entry == NULL) goto fail;
        rc = PyList_Append(log, entry);
        Py_DECREF(entry);
        if (rc < 0) goto fail;
    }
    Py_DECREF(one);
    Py_DECREF(zero);
    return Py_BuildValue("(ON)", scan_kept ? Py_True : Py_False, limits);
fail:
    Py_XDECREF(one);
    Py_XDECREF(zero);
    Py_DECREF(limits);
    return NULL;
}

/* A non-negative int below 2^62 as a long long; -1 with an error set otherwise (name: what). */
static long long small_count(PyObject *v, const char *what) {
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %s", what, Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < 0 || x >= (1LL << 62)) {
        PyErr_Format(PyExc_OverflowError, "%s must be in [0, 2**62)", what);
        return -1;
    }
    return x;
}

/* forecast_stale(calls, epoch) -> [i, ...]
 * horizon_tracker.forecast_stale_python, compiled: for each call i (a Call of the core) with
 * wf = calls[i].workflow and key = 2 * wf.num_done + len(wf.open_calls) + (epoch << 32), when
 * wf.forecast_stamp != key: wf.forecast_stamp = key and i is listed (in order). The epoch must
 * stay below 2^30 and progress below 2^32 (an OverflowError otherwise); a stamp that is not
 * such a key counts as a mismatch. */
static PyObject *forecast_stale(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 2, "forecast_stale")) return NULL;
    PyObject *calls = args[0];
    if (!is_seq(calls, "calls")) return NULL;
    long long epoch = small_count(args[1], "epoch");
    if (epoch < 0) return NULL;
    if (epoch >= (1LL << 30)) {
        PyErr_SetString(PyExc_OverflowError, "forecast_stale: a stamp needs over 62 bits");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t n = Py_SIZE(calls);
    PyObject *previous = NULL; /* borrowed, compared only: a workflow's calls often sit together */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *wf = attr(at(calls, i), A_WORKFLOW);
        if (wf == NULL) goto fail;
        if (wf == previous) { /* its key was just stamped: the same again */
            Py_DECREF(wf);
            continue;
        }
        previous = wf;
        PyObject *done = NULL, *old = NULL;
        long long nd;
        double open;
        if ((done = attr(wf, A_NUM_DONE)) == NULL || (nd = small_count(done, "num_done")) < 0)
            goto item_fail;
        if ((open = attr_len(wf, A_OPEN_CALLS)) < 0.0) goto item_fail;
        if (2 * nd + (long long)open >= (1LL << 32)) {
            PyErr_SetString(PyExc_OverflowError, "forecast_stale: a stamp needs over 62 bits");
            goto item_fail;
        }
        long long key = 2 * nd + (long long)open + (epoch << 32);
        if ((old = attr(wf, A_FORECAST_STAMP)) == NULL) goto item_fail;
        int same = 0;
        if (PyLong_CheckExact(old)) {
            int overflow = 0;
            long long was = PyLong_AsLongLongAndOverflow(old, &overflow);
            if (was == -1 && PyErr_Occurred()) goto item_fail;
            same = !overflow && was == key;
        }
        if (!same) {
            PyObject *k = PyLong_FromLongLong(key);
            PyObject *idx = k == NULL ? NULL : PyLong_FromSsize_t(i);
            int rc = idx == NULL ? -1 : PyObject_SetAttr(wf, attr_str[A_FORECAST_STAMP], k);
            if (rc == 0) rc = PyList_Append(out, idx);
            Py_XDECREF(k);
            Py_XDECREF(idx);
            if (rc < 0) goto item_fail;
        }
        Py_DECREF(wf);
        Py_DECREF(done);
        Py_DECREF(old);
        continue;
    item_fail:
        Py_DECREF(wf);
        Py_XDECREF(done);
        Py_XDECREF(old);
        goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* The flattened tree ensemble of lightgbm_rows.flatten_booster: a header of five int64
 * (trees, features, nodes, leaves, bitset words), then per tree the int32 pair (its first
 * node, its first leaf), the nodes (ens_node, 16 bytes each, each tree's together), the leaf
 * values (double) and the categorical bitsets (uint32 words). A child is a node of the same
 * tree (>= 0, from its first node) or ~leaf (from its first leaf); a tree of one leaf has no
 * node: its first node is -1. Small nodes, so that a walk through every tree touches few cache
 * lines inside a running simulation. */
typedef struct {
    union {
        double threshold; /* numerical */
        struct { int32_t offset, words; } bits; /* categorical: its bitset */
    } split;
    int16_t left, right;
    uint8_t feature, flags; /* LightGBM's decision type: 1 categorical, 2 default left, missing << 2 */
    uint16_t unused;
} ens_node;

/* LightGBM's kZeroThreshold (a float): inputs this close to 0 read as 0 */
#define ENS_ZERO ((double)1e-35f)

/* The layout of a flattened ensemble, once its blob has been checked (ens_check). */
typedef struct {
    int64_t trees, features, nodes, leaves, words;
    const int32_t *firsts;
    const ens_node *node;
    const double *leaf;
    const uint32_t *word;
} ens_layout;

/* Check a blob whole, once: its sizes add up, and every tree's nodes lead only to nodes of the
 * same tree with higher indices (as LightGBM numbers them: a walk always ends) or to its own
 * leaves, read existing features, and keep their bitsets inside the words. 0 if it is sound. */
static int ens_check(const char *base, Py_ssize_t size, ens_layout *out) {
    int64_t head[5];
    if (size < (Py_ssize_t)sizeof head) return -1;
    memcpy(head, base, sizeof head);
    int64_t T = head[0], F = head[1], N = head[2], L = head[3], W = head[4];
    if (T < 1 || F < 0 || F > 256 || N < 0 || L < 1 || W < 0 || T > (1 << 24)
            || N > (1 << 26) || L > (1 << 26) || W > (1 << 26))
        return -1;
    Py_ssize_t nodes_at = sizeof head + 8 * T;
    Py_ssize_t leaves_at = nodes_at + (Py_ssize_t)sizeof(ens_node) * N;
    Py_ssize_t words_at = leaves_at + 8 * L;
    if (size != words_at + 4 * W) return -1;
    *out = (ens_layout){T, F, N, L, W, (const int32_t *)(base + sizeof head),
                        (const ens_node *)(base + nodes_at), (const double *)(base + leaves_at),
                        (const uint32_t *)(base + words_at)};
    int64_t end = N, leaf_end = L; /* where the nodes and leaves of tree t end: from the last */
    for (int64_t t = T - 1; t >= 0; t--) {
        int64_t first = out->firsts[2 * t], leaf0 = out->firsts[2 * t + 1];
        if (leaf0 < 0 || leaf0 >= leaf_end) return -1;
        if (first >= 0) {
            if (first >= end) return -1;
            for (int64_t k = first; k < end; k++) {
                const ens_node *nd = &out->node[k];
                if (nd->feature >= F) return -1;
                int32_t kids[2] = {nd->left, nd->right};
                for (int c = 0; c < 2; c++)
                    if (kids[c] >= 0 ? (kids[c] <= k - first || first + kids[c] >= end)
                                     : leaf0 + ~(int64_t)kids[c] >= leaf_end)
                        return -1;
                if ((nd->flags & 1) && (nd->split.bits.offset < 0 || nd->split.bits.words < 0
                                        || nd->split.bits.offset + (int64_t)nd->split.bits.words
                                               > W))
                    return -1;
            }
            end = first;
        }
        leaf_end = leaf0;
    }
    return 0;
}

/* Whether node nd sends value v left, where a plain comparison does not decide: categorical
 * nodes, missing type Zero, and every node in a row that holds a NaN (ensemble_score's
 * rules). */
static int ens_slow_side(const ens_layout *e, const ens_node *nd, double v) {
    if (nd->flags & 1) {
        if (isnan(v) || v <= -1.0 || v >= 2147483648.0) return 0;
        int32_t cat = (int32_t)v, word = cat / 32;
        return word < nd->split.bits.words
               && ((e->word[nd->split.bits.offset + word] >> (cat % 32)) & 1u);
    }
    int missing = (nd->flags >> 2) & 3;
    if (isnan(v) && missing != 2) v = 0.0;
    if ((missing == 1 && fabs(v) <= ENS_ZERO) || (missing == 2 && isnan(v)))
        return (nd->flags & 2) != 0;
    return v <= nd->split.threshold;
}

static PyObject *ens_checked = NULL; /* the last blob ens_check passed (a strong reference) */
static ens_layout ens_checked_layout;

/* ensemble_score(blob, row) -> float
 * The raw score (sum of each tree's leaf value, tree by tree from 0.0) of the flattened
 * ensemble blob for row (a list or tuple of floats, one per feature), with LightGBM's
 * prediction rules: an input within 1e-35f (as a float) of 0 reads as 0; a numerical node
 * with missing type (flags >> 2 & 3) Zero sends 0 and NaN-as-0, and with missing type NaN
 * sends NaN, to its default side (flags bit 1: left), anything else left when value <=
 * threshold; a categorical node (flags bit 0) sends NaN, values <= -1 and values >= 2^31
 * right, else the category (int)value left when its bit is set in the node's bitset. A blob
 * is checked whole when it differs from the last one scored (ens_check). */
static PyObject *ensemble_score(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 2, "ensemble_score")) return NULL;
    PyObject *blob = args[0], *row = args[1];
    if (!PyBytes_CheckExact(blob)) {
        PyErr_SetString(PyExc_TypeError, "blob must be bytes");
        return NULL;
    }
    if (!is_seq(row, "row")) return NULL;
    if (blob != ens_checked) {
        ens_layout layout;
        if (ens_check(PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob), &layout) < 0) {
            PyErr_SetString(PyExc_ValueError, "ensemble_score: blob is not a flattened ensemble "
                            "(lightgbm_rows.flatten_booster)");
            return NULL;
        }
        Py_INCREF(blob);
        Py_XSETREF(ens_checked, blob);
        ens_checked_layout = layout;
    }
    const ens_layout *e = &ens_checked_layout;
    if (Py_SIZE(row) != e->features) {
        PyErr_Format(PyExc_ValueError, "ensemble_score: the row has %zd values, the model %lld "
                     "features", Py_SIZE(row), (long long)e->features);
        return NULL;
    }
    double x[256];
    int any_nan = 0;
    for (Py_ssize_t j = 0; j < e->features; j++) {
        double v = PyFloat_AsDouble(at(row, j));
        if (v == -1.0 && PyErr_Occurred()) return NULL;
        x[j] = fabs(v) <= ENS_ZERO ? 0.0 : v;
        any_nan |= isnan(v);
    }
    double score = 0.0;
    for (int64_t t = 0; t < e->trees; t++) {
        int32_t first = e->firsts[2 * t], at_node = first < 0 ? -1 : 0;
        const ens_node *tree = first < 0 ? e->node : e->node + first;
        while (at_node >= 0) {
            const ens_node *nd = &tree[at_node];
            double v = x[nd->feature];
            int kind = nd->flags & 13; /* categorical bit and missing type */
            int go_left = !any_nan && (kind == 0 || kind == 8) ? v <= nd->split.threshold
                                                               : ens_slow_side(e, nd, v);
            at_node = go_left ? nd->left : nd->right;
        }
        score += e->leaf[e->firsts[2 * t + 1] + ~at_node];
    }
    return PyFloat_FromDouble(score);
}

static PyMethodDef methods[] = {
    {"best_prefill_pairs", (PyCFunction)(void (*)(void))best_prefill_pairs, METH_FASTCALL,
     "best_prefill_pairs(now, free, pf_members, pf_class, scan, count, ctx, tokens, dec_static, "
     "batch_top, capacity, slow_start, pfs, xcols, xfer, weights, own_ctxs, kvs, kv_trues, "
     "slack, any_full, slots) -> [(p, d, delta)]: best_prefill_pair_one of each call in slots."},
    {"prefill_grid", (PyCFunction)(void (*)(void))prefill_grid, METH_FASTCALL,
     "prefill_grid(<best_prefill_pairs' arguments>, out) -> None: prefill_delta_one of each call "
     "in slots written into out[i] (float64, n x P x D)."},
    {"decode_limits", (PyCFunction)(void (*)(void))decode_limits, METH_FASTCALL,
     "decode_limits(capacity, tokens, count, max_batch) -> (slack, any_full): "
     "PlanState._decode_limits."},
    {"observe_step", (PyCFunction)(void (*)(void))observe_step, METH_FASTCALL,
     "observe_step(delta, picked, age, h_est, free, tokens, count, capacity, max_batch, calls_t, "
     "pre_t, dec_t, glob_t, cached_t, grid_t, inv, clip, now, picks, cols) -> "
     "(obs, mask): the env's observation (see the source)."},
    {"begin_rows", (PyCFunction)(void (*)(void))begin_rows, METH_FASTCALL,
     "begin_rows(calls, decode_stage, now, inv, clip, log_tokens, table, cached, clear, prefill, "
     "pre, decode, dec, max_batch, cols, glob, glob_values) -> (age, h_est, running, batched): "
     "the env's per-decision features."},
    {"risk_plan", (PyCFunction)(void (*)(void))risk_plan, METH_FASTCALL,
     "risk_plan(...) -> [(slot, p, d, delta)]: hexagent_gym.agents.hexagent's ranking of a prefill window, "
     "compiled (see the source)."},
    {"match_levels", (PyCFunction)(void (*)(void))match_levels, METH_FASTCALL,
     "match_levels(holders, blocks) -> [(k, mask)] or None: prefix_cache.match_levels."},
    {"decode_cells", (PyCFunction)(void (*)(void))decode_cells, METH_FASTCALL,
     "decode_cells(out, slots, rows, cols, weights, own_ctxs, now, count, ctx, dec_static, "
     "batch_top) -> None: decode-stage Δ cells no decode limit binds (see the source)."},
    {"standalone_estimate", (PyCFunction)(void (*)(void))standalone_estimate, METH_FASTCALL,
     "standalone_estimate(pf_est, l_in, l_out, dec_err, dec_base, dec_slope, pair_p, setup, "
     "spt) -> float: ClusterTables.standalone_estimate."},
    {"cache_lock", (PyCFunction)(void (*)(void))cache_lock, METH_FASTCALL,
     "cache_lock(lru, refs, touch, blocks, k) -> k: PrefixCache.lock."},
    {"cache_insert", (PyCFunction)(void (*)(void))cache_insert, METH_FASTCALL,
     "cache_insert(lru, refs, holders, bit, blocks, start, capacity, touch) -> (end, added, "
     "full): PrefixCache.insert up to the first block that needs an eviction."},
    {"cache_unlock", (PyCFunction)(void (*)(void))cache_unlock, METH_FASTCALL,
     "cache_unlock(refs, blocks, k) -> None: PrefixCache.unlock."},
    {"earliest_pair", (PyCFunction)(void (*)(void))earliest_pair, METH_FASTCALL,
     "earliest_pair(...) -> (p, d, delta): placement.earliest_pair_python (see the source)."},
    {"commit_prefill_picks", (PyCFunction)(void (*)(void))commit_prefill_picks, METH_FASTCALL,
     "commit_prefill_picks(picks, cache_aware, free, pf_tokens, tokens, count, ctx, log, now, "
     "capacity, max_batch, scan_kept, limits) -> (scan_kept, limits): the loop of "
     "PlanState.commit_prefill_picks (see the source)."},
    {"prefill_free_times", (PyCFunction)(void (*)(void))prefill_free_times, METH_FASTCALL,
     "prefill_free_times(run_end, now, queued) -> [float]: entities.prefill_free_times."},
    {"forecast_stale", (PyCFunction)(void (*)(void))forecast_stale, METH_FASTCALL,
     "forecast_stale(calls, epoch) -> [i, ...]: "
     "horizon_tracker.forecast_stale_python."},
    {"ensemble_score", (PyCFunction)(void (*)(void))ensemble_score, METH_FASTCALL,
     "ensemble_score(blob, row) -> float: the raw score of a flattened LightGBM ensemble "
     "(lightgbm_rows.flatten_booster)."},
    {"decode_scan", (PyCFunction)(void (*)(void))decode_scan, METH_FASTCALL,
     "decode_scan(kind, tokens, count, ctx) -> [d, ...]: placement.decode_scan."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "Compiled twins of the core's scalar placement rules.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    import_array();
    static const char *const keys[6] = {"calls", "delta", "prefill", "decode", "globals",
                                        "cached"};
    for (int i = 0; i < 6; i++)
        if (obs_keys[i] == NULL && (obs_keys[i] = PyUnicode_InternFromString(keys[i])) == NULL)
            return NULL;
    for (int i = 0; i < A_COUNT; i++)
        if (attr_str[i] == NULL && (attr_str[i] = PyUnicode_InternFromString(attr_names[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
