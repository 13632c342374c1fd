"""pareto.py: the sweep table's shared arithmetic for plot_pareto.py and leaderboard.py (issue 11),
standard library only (the leaderboard and the tests need no matplotlib).

- load(dirs): the rows of OUT/summary.csv of one or more sweep folders (mean and standard deviation over
  seeds per trace, layer, method+params, k), numbers as floats (None where empty).
- average_layers(rows): the same rows averaged over the layers of each trace (or over every trace and layer
  with across_traces), per method+params and k; a std is the root mean square of the per-layer stds.
- pareto_front(points, higher_better): the indices of the non-dominated (cost, quality) points, by cost.
- front_curve / interp_log / auc_log / cost_to_reach: the envelope of one method over all its parameter
  points, read on a log cost axis (linear interpolation in log cost between front points).
"""
import csv
import math
import os

METRICS = {  # y axis: summary.csv column, label, higher is better
    "recall": ("recall_mean", "recall@k", True),
    "mass": ("mass_mean", "attention mass recall", True),
    "output_error": ("output_error_mean", "output error |o_att - o| / |o|", False),
}
COSTS = {  # x axis: summary.csv column, label
    "budget": ("budget_effective_mean", "effective budget (tokens retrieved per step)"),
    "time": ("search_us_median_mean", "search time per step (µs, median)"),
    "bytes": ("index_bytes_per_token_mean", "index bytes per token"),
}


def _num(x):
    try:
        v = float(x)
        return v if math.isfinite(v) else None
    except (TypeError, ValueError):
        return None


def load(dirs):
    rows = []
    for d in dirs:
        p = os.path.join(d, "summary.csv") if os.path.isdir(d) else d
        if not os.path.isfile(p):
            raise SystemExit(f"{p}: no such file (a sweep folder holds summary.csv; run scripts/sweep.py first)")
        for r in csv.DictReader(open(p, newline="")):
            o = {k: (v if k in ("trace", "layer", "method", "params", "device") else _num(v)) for k, v in r.items()}
            rows.append(o)
    if not rows:
        raise SystemExit(f"{', '.join(dirs)}: the sweep table has no rows")
    return rows


def average_layers(rows, across_traces=False):
    groups = {}
    for r in rows:
        key = ("all" if across_traces else r["trace"], r["method"], r["params"], r["k"])
        groups.setdefault(key, []).append(r)
    out = []
    for (trace, m, p, k), g in groups.items():
        o = {"trace": trace, "layer": f"mean of {len(g)} layer{'s' if len(g) > 1 else ''}", "method": m, "params": p,
             "k": k, "device": g[0]["device"], "seeds": g[0]["seeds"]}
        for col in g[0]:
            if col.endswith("_mean"):
                xs = [x[col] for x in g if x[col] is not None]
                o[col] = sum(xs) / len(xs) if xs else None
            elif col.endswith("_std"):
                xs = [x[col] for x in g if x[col] is not None]
                o[col] = math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else None
        out.append(o)
    return out


def pareto_front(points, higher_better=True):
    """Indices of the points (cost, quality) no other point dominates (cost <= and quality >= with one of them
    strict; quality <= for lower-is-better metrics), sorted by cost. Points with a None are ignored."""
    idx = [i for i, (c, q) in enumerate(points) if c is not None and q is not None]
    sign = 1 if higher_better else -1
    idx.sort(key=lambda i: (points[i][0], -sign * points[i][1]))
    front, best = [], None
    for i in idx:
        q = sign * points[i][1]
        if best is None or q > best:
            front.append(i)
            best = q
    return front


def front_curve(rows, cost_col, metric_col, higher_better, positive_cost=True):
    pts = [(r[cost_col], r[metric_col]) for r in rows]
    if positive_cost:
        pts = [(c, q) if c is not None and c > 0 else (None, None) for c, q in pts]
    return [pts[i] for i in pareto_front(pts, higher_better)]


def interp_log(curve, x):
    """The front's quality at cost x (log-linear between front points); None left of its first point; the last
    point's quality right of its last point (a larger budget is never worse than the best one measured)."""
    if not curve or x < curve[0][0]:
        return None
    for (c0, q0), (c1, q1) in zip(curve, curve[1:]):
        if c0 <= x <= c1:
            if c1 == c0:
                return q1
            f = (math.log(x) - math.log(c0)) / (math.log(c1) - math.log(c0))
            return q0 + f * (q1 - q0)
    return curve[-1][1]


def auc_log(curve, lo, hi, n=512):
    """Mean quality over log cost in [lo, hi] (the area under the front divided by log(hi/lo)); quality 0
    where the method has no point yet (below its smallest cost)."""
    s = 0.0
    for j in range(n):
        x = math.exp(math.log(lo) + (j + 0.5) / n * (math.log(hi) - math.log(lo)))
        q = interp_log(curve, x)
        s += q if q is not None else 0.0
    return s / n


def cost_to_reach(curve, target, higher_better=True):
    """The smallest cost at which the front reaches the target (log-linear interpolation), or None."""
    ok = (lambda q: q >= target) if higher_better else (lambda q: q <= target)
    for j, (c, q) in enumerate(curve):
        if ok(q):
            if j == 0:
                return c
            c0, q0 = curve[j - 1]
            f = (target - q0) / (q - q0) if q != q0 else 1.0
            return math.exp(math.log(c0) + f * (math.log(c) - math.log(c0)))
    return None
