#!/usr/bin/env python3
"""Scaling-law fits and plots for `nsatron sweep report DIR`.

usage: report_fit.py --dir DIR [--bins-per-decade K]
       (run with Debian's /usr/bin/python3: it needs numpy, scipy and matplotlib)

Inputs (written by `nsatron sweep run`)
  DIR/results.csv          one row per run: run, status, the sweep's axis columns, then attention,
                           layout, device, params, params_nonembed, tokens, steps, tokens_per_step,
                           flops_per_token, flops, final_train_loss, final_val_loss, tokens_per_s,
                           mfu, wall_s (the last six empty when unknown).
  DIR/<run>/metrics.jsonl  step records {"step", "loss", "tokens", "tokens_per_s", ...} and eval
                           records {"step", "val_loss"}. The last record of a step wins (a resumed
                           run appends after its restart); unreadable lines are skipped and counted.

Only runs with status `done` enter the fits; the others are listed. N is always the non-embedding
parameter count (`params_nonembed`), D the tokens seen, C the training FLOPs spent so far:
C = flops_per_token * step * tokens_per_step at each validation point of a run's curve.

The math (each fit is done separately for every attention kind, `nsa` and `dense`)
  Compute frontier. All validation points (step > 0) of the done runs, as (C, L) pairs. log10 C is
    cut into bins (K per decade, default 8); the lowest loss of each bin is kept, then only those
    points lower than every kept point of smaller compute: the lower envelope, the best loss any
    run of the sweep reached for a given compute.
  Compute law. L(C) = E + A * C^(-a), fitted to the frontier by least squares on log L (the noise
    of a loss is roughly multiplicative). Parametrised as E + exp(lnA_ref - a * ln(C / C_ref)) with
    C_ref the geometric mean of the points, so that the three parameters are of order one and
    weakly correlated; bounds E in [0, max L], a in [1e-3, 3]. A = exp(lnA_ref) * C_ref^a is
    reported in the plain form, its error by the delta method. Needs at least 4 points.
  Size-and-data law. L(N, D) = E + A / N^a + B / D^b, parametrised and fitted the same way
    (N_ref, D_ref geometric means). Points: the final validation loss of every done run, plus the
    validation points along each run's curve after its first third (the warmup and the fast early
    drop stay out), so that a small grid gives enough points. Needs 2 distinct N and 2 distinct
    token budgets among the done runs, and more points than the 5 parameters.
  Compute-optimal size. With the L(N, D) fit and C = flops_per_token(N) * D, where
    flops_per_token(N) = k * N^p is fitted (log-log) on the runs' own flops_per_token (it holds the
    embedding and attention costs that 6 N leaves out), the optimal N for each C on a log grid is
    found numerically (a log grid over N, then a bounded refinement). The law gives the exponent in
    closed form too: N_opt ~ C^(b / (a + p b)), reported with its error. The empirical optimum at
    each compute level is the N of the run whose validation curve, interpolated in log C, is lowest
    there (levels where at least 2 runs reach). Each curve point stands for "a run trained that
    far", though a run part-way through its learning-rate schedule is not a run that ended there.
  Standard errors are 1 sigma, from curve_fit's covariance (scaled by the residual variance).

Outputs, all in DIR
  fit.json              every fit: values with errors, point counts, residuals, or
                        {"skipped": "<reason>"}; the frontier points; the optimal sizes.
  summary.md            runs done and not done, a table of the done runs, the fits in numbers and
                        in words (NSA and dense side by side), NSA vs dense at equal compute,
                        the skipped fits with their reasons, links to the plots.
  plots/loss_curves.png    validation (and faint train) loss against tokens seen, per run.
  plots/loss_vs_flops.png  final validation loss against training FLOPs, frontier, fitted L(C).
  plots/optimal_size.png   compute-optimal N against C: fitted curve and empirical points.
  plots/throughput.png     tokens/s per run by layout, and MFU where a peak is known.

Exit status: 0 the report was written (even with runs missing or fits skipped); 2 DIR or
DIR/results.csv missing or unreadable (message on stderr); 3 numpy/scipy/matplotlib missing.
"""
import argparse
import csv
import json
import math
import os
import sys
import warnings

try:
    import numpy as np
    from scipy.optimize import curve_fit, minimize_scalar
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Patch
except ImportError as e:  # the first python3 on PATH may not be Debian's
    print(f"report_fit.py: {e}; run it with /usr/bin/python3 (numpy, scipy, matplotlib)",
          file=sys.stderr)
    sys.exit(3)

FIXED_COLUMNS = ["attention", "layout", "device", "params", "params_nonembed", "tokens", "steps",
                 "tokens_per_step", "flops_per_token", "flops", "final_train_loss",
                 "final_val_loss", "tokens_per_s", "mfu", "wall_s"]
NUMERIC_COLUMNS = FIXED_COLUMNS[3:]
ATTENTION_ORDER = ["nsa", "dense"]
ATTENTION_STYLE = {"nsa": ("tab:blue", "o", "-"), "dense": ("tab:orange", "s", "--")}
MIN_COMPUTE_POINTS = 4
ND_PARAMS = 5


class InputError(Exception):
    """results.csv or the sweep directory cannot be used: exit 2."""


# ----------------------------------------------------------------------------------------------
# Reading the sweep
# ----------------------------------------------------------------------------------------------

def to_float(text):
    """A CSV or JSON number as float; empty or unreadable -> nan."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def read_results(path):
    """results.csv -> (rows as dicts with numbers converted, axis column names)."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            body = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"cannot read {path}: {e}")
    if not header:
        raise InputError(f"{path} is empty (no header)")
    header = [h.strip() for h in header]
    for needed in ("run", "status", "attention"):
        if needed not in header:
            raise InputError(f"{path}: no '{needed}' column in the header {header}")
    i_status, i_attention = header.index("status"), header.index("attention")
    if i_attention < i_status:
        raise InputError(f"{path}: 'attention' comes before 'status' in the header")
    axes = header[i_status + 1:i_attention]
    missing = [c for c in FIXED_COLUMNS if c not in header]
    if missing:
        print(f"report_fit.py: warning: {path} lacks columns {missing}; taken as unknown",
              file=sys.stderr)
    rows = []
    for cells in body:
        if not any(c.strip() for c in cells):
            continue
        row = {h: (cells[i].strip() if i < len(cells) else "") for i, h in enumerate(header)}
        for c in NUMERIC_COLUMNS:
            row[c] = to_float(row.get(c, ""))
        row["axes"] = {a: row[a] for a in axes}
        rows.append(row)
    return rows, axes


def parse_record(line):
    """One metrics line -> its dict, or None unless it is a JSON object with a step >= 0."""
    try:
        rec = json.loads(line)
        step = rec["step"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not step >= 0:
        return None
    return rec


def read_metrics(path):
    """metrics.jsonl -> {"steps": {step: record}, "evals": {step: val_loss}, "bad_lines", "missing"}.

    The last record of each step wins; lines that are not a JSON object with a numeric step
    (a run killed mid-write, nan written by a C++ stream) are skipped and counted. A line whose
    start was cut off by a kill and that the restarted run continued ('{"step": 20, "lo{"step":
    10, ...}') is counted as bad, and its last whole record is still read."""
    out = {"steps": {}, "evals": {}, "bad_lines": 0, "missing": False}
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        out["missing"] = True
        return out
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        rec = parse_record(line)
        if rec is None:
            out["bad_lines"] += 1
            glued = line.rfind('{"step"')
            rec = parse_record(line[glued:]) if glued > 0 else None
            if rec is None:
                continue
        step = int(rec["step"])
        if "val_loss" in rec:
            val = to_float(rec["val_loss"])
            if math.isfinite(val) and val > 0:
                out["evals"][step] = val
        if "loss" in rec:
            out["steps"][step] = rec
    return out


def load_sweep(sweep_dir):
    """Every run of the sweep: its results.csv row plus its metrics."""
    if not os.path.isdir(sweep_dir):
        raise InputError(f"sweep directory {sweep_dir} does not exist")
    results = os.path.join(sweep_dir, "results.csv")
    if not os.path.isfile(results):
        raise InputError(f"{results} does not exist (has `nsatron sweep run` written it?)")
    rows, axes = read_results(results)
    for row in rows:
        row["metrics"] = read_metrics(os.path.join(sweep_dir, row["run"], "metrics.jsonl"))
    return rows, axes


def eval_curve(run):
    """A run's validation curve (step > 0), sorted: dict of arrays step, tokens, C, L."""
    evals = run["metrics"]["evals"]
    steps = np.array(sorted(s for s in evals if s > 0), dtype=float)
    loss = np.array([evals[int(s)] for s in steps], dtype=float)
    tps = run["tokens_per_step"]
    if math.isfinite(tps):
        tokens = steps * tps
    else:  # fall back on the tokens the step records counted
        recs = run["metrics"]["steps"]
        tokens = np.array([to_float(recs.get(int(s), {}).get("tokens")) for s in steps])
    return {"step": steps, "tokens": tokens, "C": tokens * run["flops_per_token"], "L": loss}


def train_curve(run):
    """A run's training loss against tokens seen (loss <= 0 or non-finite: not a loss)."""
    recs = run["metrics"]["steps"]
    steps = sorted(recs)
    loss = np.array([to_float(recs[s].get("loss")) for s in steps])
    tokens = np.array([to_float(recs[s].get("tokens")) for s in steps])
    if math.isfinite(run["tokens_per_step"]):
        tokens = np.where(np.isfinite(tokens), tokens, np.array(steps) * run["tokens_per_step"])
    ok = np.isfinite(loss) & (loss > 0) & np.isfinite(tokens) & (tokens > 0)
    return tokens[ok], loss[ok]


def final_val_loss(run):
    """results.csv's final validation loss, else the last point of the curve."""
    if math.isfinite(run["final_val_loss"]):
        return run["final_val_loss"]
    curve = eval_curve(run)
    return float(curve["L"][-1]) if curve["L"].size else math.nan


def run_flops(run):
    if math.isfinite(run["flops"]):
        return run["flops"]
    return run["tokens"] * run["flops_per_token"]


# ----------------------------------------------------------------------------------------------
# Fits: pure functions of numpy arrays, returning dicts
# ----------------------------------------------------------------------------------------------

def frontier(C, L, bins_per_decade=8):
    """Lower envelope of loss against compute: per bin of log10 C the lowest loss, then only the
    points lower than every kept point of smaller compute. Non-finite or C <= 0 points are
    ignored. Returns {"C", "L", "index"} (index into the inputs), sorted by C."""
    C, L = np.asarray(C, dtype=float), np.asarray(L, dtype=float)
    idx = np.nonzero(np.isfinite(C) & np.isfinite(L) & (C > 0))[0]
    keep = []
    if idx.size:
        bins = np.floor(np.log10(C[idx]) * bins_per_decade + 1e-9).astype(int)
        best = math.inf
        for b in np.unique(bins):
            members = idx[bins == b]
            order = np.lexsort((C[members], L[members]))  # lowest loss, then smallest C
            i = members[order[0]]
            if L[i] < best:
                keep.append(i)
                best = L[i]
    keep = np.array(keep, dtype=int)
    return {"C": C[keep], "L": L[keep], "index": keep}


def _check_points(columns, names, n_params):
    """None when the points can carry a fit of n_params parameters, else the reason."""
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        return "arrays of different lengths"
    bad = [nm for nm, c in zip(names, columns) if not np.all(np.isfinite(c) & (c > 0))]
    if bad:
        return f"non-finite or non-positive values in {', '.join(bad)}"
    if n <= n_params:
        return f"{n} points, needs more than {n_params} (one per parameter and one more)"
    if np.ptp(columns[-1]) <= 1e-12 * np.max(columns[-1]):
        return "the loss does not vary between the points"
    return None


def _least_squares_log(model, xdata, L, starts, bounds):
    """curve_fit of log(model) to log L from each start; the best fit (popt, pcov, rms)."""
    logL = np.log(L)

    def log_model(x, *p):
        return np.log(model(x, *p))

    best = None
    for p0 in starts:
        p0 = np.clip(p0, bounds[0], bounds[1])
        try:
            with warnings.catch_warnings():  # overflow on the way, "covariance not estimated"
                warnings.simplefilter("ignore")
                popt, pcov = curve_fit(log_model, xdata, logL, p0=p0, bounds=bounds, max_nfev=5000)
        except (RuntimeError, ValueError, np.linalg.LinAlgError):
            continue
        resid = log_model(xdata, *popt) - logL
        if not np.all(np.isfinite(resid)):
            continue
        cost = float(np.sum(resid ** 2))
        if best is None or cost < best[2]:
            best = (popt, pcov, cost)
    if best is None:
        return None
    popt, pcov, cost = best
    return popt, pcov, math.sqrt(cost / len(logL))


def _at_bounds(popt, bounds, names):
    """Names of the parameters that ended on a bound (their errors mean little)."""
    hit = []
    for name, v, lo, hi in zip(names, popt, bounds[0], bounds[1]):
        span = hi - lo
        if v - lo <= 1e-6 * span or hi - v <= 1e-6 * span:
            hit.append(name)
    return hit


def _mark_bounds(fit):
    """Flags each parameter that ended on a bound ("at_bound": true): its covariance error is
    not a standard error there, and the summary prints the value alone."""
    for name in fit["at_bounds"]:
        fit["params"][name]["at_bound"] = True


def _value(v, var):
    s = math.sqrt(var) if math.isfinite(var) and var >= 0 else None
    return {"value": float(v), "stderr": s}


def _plain_coefficient(ln_ref, exponent, ref, pcov, i_ln, i_exp):
    """X of X * v^(-exponent) from the fitted exp(ln_ref) * (v / ref)^(-exponent):
    ln X = ln_ref + exponent * ln ref, its error by the delta method."""
    lr = math.log(ref)
    var = pcov[i_ln, i_ln] + lr ** 2 * pcov[i_exp, i_exp] + 2 * lr * pcov[i_ln, i_exp]
    X = math.exp(ln_ref + exponent * lr)
    return {"value": X, "stderr": X * math.sqrt(var) if math.isfinite(var) and var >= 0 else None}


def _compute_model(x, E, lnA, a):
    """x = ln(C / C_ref)."""
    return E + np.exp(lnA - a * x)


def fit_compute_law(C, L):
    """L(C) = E + A * C^(-a) by least squares on log L. Returns {"params": {E, A, a, A_ref}
    (each {"value", "stderr"}), "C_ref", "cov" (of E, lnA_ref, a), "n_points", "rms_log_residual",
    "at_bounds"} or {"skipped": reason, "n_points"}."""
    C, L = np.asarray(C, dtype=float).ravel(), np.asarray(L, dtype=float).ravel()
    out = {"law": "L(C) = E + A * C^(-a)", "n_points": int(L.size)}
    if L.size < MIN_COMPUTE_POINTS:
        out["skipped"] = f"{L.size} frontier points, needs at least {MIN_COMPUTE_POINTS}"
        return out
    reason = _check_points([C, L], ["C", "L"], 3)
    if reason is None and np.ptp(np.log(C)) < 1e-9:
        reason = "all points have the same compute"
    if reason:
        out["skipped"] = reason
        return out
    C_ref = float(np.exp(np.mean(np.log(C))))
    x = np.log(C / C_ref)
    lo_L = float(np.min(L))
    bounds = ([0.0, math.log(1e-8), 1e-3], [float(np.max(L)), math.log(1e4), 3.0])
    starts = []
    for frac in (0.0, 0.5, 0.8, 0.95):
        for a0 in (0.05, 0.2, 0.6):
            E0 = frac * lo_L
            starts.append([E0, math.log(max(np.mean(L) - E0, 1e-6)), a0])
    fitted = _least_squares_log(_compute_model, x, L, starts, bounds)
    if fitted is None:
        out["skipped"] = "the fit did not converge from any start"
        return out
    (E, lnA, a), pcov, rms = fitted
    out.update({
        "params": {"E": _value(E, pcov[0, 0]), "A": _plain_coefficient(lnA, a, C_ref, pcov, 1, 2),
                   "a": _value(a, pcov[2, 2]),
                   "A_ref": {"value": math.exp(lnA),
                             "stderr": (math.exp(lnA) * math.sqrt(pcov[1, 1])
                                        if math.isfinite(pcov[1, 1]) else None)}},
        "parametrisation": "L = E + exp(lnA_ref - a * ln(C / C_ref)); A = exp(lnA_ref) * C_ref^a",
        "C_ref": C_ref,
        "cov": [[float(v) for v in row] for row in pcov],
        "rms_log_residual": rms,
        "C_range": [float(C.min()), float(C.max())],
        "at_bounds": _at_bounds([E, lnA, a], bounds, ["E", "A", "a"]),
    })
    _mark_bounds(out)
    return out


def predict_compute_law(fit, C):
    """(predicted loss, its 1-sigma error) at compute C from a fit_compute_law result."""
    p = fit["params"]
    x = math.log(C / fit["C_ref"])
    e = p["A_ref"]["value"] * math.exp(-p["a"]["value"] * x)
    grad = np.array([1.0, e, -x * e])
    var = float(grad @ np.array(fit["cov"]) @ grad)
    return p["E"]["value"] + e, (math.sqrt(var) if math.isfinite(var) and var >= 0 else math.nan)


def compute_for_loss(fit, loss):
    """The compute at which the fitted law reaches a loss (nan when below E)."""
    p = fit["params"]
    gap = loss - p["E"]["value"]
    if gap <= 0:
        return math.nan
    return fit["C_ref"] * (gap / p["A_ref"]["value"]) ** (-1.0 / p["a"]["value"])


def _nd_model(xy, E, lnA, a, lnB, b):
    """xy = (ln(N / N_ref), ln(D / D_ref))."""
    return E + np.exp(lnA - a * xy[0]) + np.exp(lnB - b * xy[1])


def fit_nd_law(N, D, L):
    """L(N, D) = E + A / N^a + B / D^b by least squares on log L. Returns {"params": {E, A, a, B, b}
    (each {"value", "stderr"}), "N_ref", "D_ref", "cov" (of E, lnA_ref, a, lnB_ref, b),
    "n_points", "rms_log_residual", "at_bounds"} or {"skipped": reason, "n_points"}."""
    N, D, L = (np.asarray(v, dtype=float).ravel() for v in (N, D, L))
    out = {"law": "L(N, D) = E + A / N^a + B / D^b", "n_points": int(L.size)}
    reason = _check_points([N, D, L], ["N", "D", "L"], ND_PARAMS)
    if reason is None:
        n_N, n_D = len(np.unique(N)), len(np.unique(D))
        if n_N < 2 or n_D < 2:
            reason = f"needs at least 2 distinct N and 2 distinct D, has {n_N} N and {n_D} D"
    if reason:
        out["skipped"] = reason
        return out
    N_ref, D_ref = (float(np.exp(np.mean(np.log(v)))) for v in (N, D))
    xy = np.vstack([np.log(N / N_ref), np.log(D / D_ref)])
    lo_L = float(np.min(L))
    bounds = ([0.0, math.log(1e-8), 1e-3, math.log(1e-8), 1e-3],
              [float(np.max(L)), math.log(1e4), 3.0, math.log(1e4), 3.0])
    starts = []
    for frac in (0.0, 0.5, 0.8, 0.95):
        for e0 in (0.1, 0.3, 0.7):
            E0 = frac * lo_L
            half = math.log(max((np.mean(L) - E0) / 2, 1e-6))
            starts.append([E0, half, e0, half, e0])
    fitted = _least_squares_log(_nd_model, xy, L, starts, bounds)
    if fitted is None:
        out["skipped"] = "the fit did not converge from any start"
        return out
    (E, lnA, a, lnB, b), pcov, rms = fitted

    out.update({
        "params": {"E": _value(E, pcov[0, 0]), "A": _plain_coefficient(lnA, a, N_ref, pcov, 1, 2),
                   "a": _value(a, pcov[2, 2]),
                   "B": _plain_coefficient(lnB, b, D_ref, pcov, 3, 4), "b": _value(b, pcov[4, 4])},
        "parametrisation": ("L = E + exp(lnA_ref - a ln(N/N_ref)) + exp(lnB_ref - b ln(D/D_ref)); "
                            "A = exp(lnA_ref) N_ref^a, B = exp(lnB_ref) D_ref^b"),
        "N_ref": N_ref, "D_ref": D_ref,
        "cov": [[float(v) for v in row] for row in pcov],
        "rms_log_residual": rms,
        "at_bounds": _at_bounds([E, lnA, a, lnB, b], bounds, ["E", "A", "a", "B", "b"]),
    })
    _mark_bounds(out)
    return out


def predict_nd_law(fit, N, D):
    """Predicted loss of the L(N, D) fit (arrays broadcast)."""
    p = fit["params"]
    return (p["E"]["value"] + p["A"]["value"] * np.power(N, -p["a"]["value"])
            + p["B"]["value"] * np.power(D, -p["b"]["value"]))


def fit_flops_per_token(N, fpt):
    """flops_per_token(N) = k * N^p, log-log least squares; p = 1 with a single size."""
    N, fpt = np.asarray(N, dtype=float), np.asarray(fpt, dtype=float)
    ok = np.isfinite(N) & np.isfinite(fpt) & (N > 0) & (fpt > 0)
    N, fpt = N[ok], fpt[ok]
    if N.size == 0:
        return {"skipped": "no run with both params_nonembed and flops_per_token"}
    if len(np.unique(N)) < 2:
        return {"k": float(np.mean(fpt / N)), "p": 1.0, "note": "one size: p = 1 assumed"}
    p, lnk = np.polyfit(np.log(N), np.log(fpt), 1)
    return {"k": float(math.exp(lnk)), "p": float(p)}


def optimal_size_fitted(nd_fit, fpt_model, C_grid, N_range):
    """Compute-optimal N for each C of C_grid under the L(N, D) fit, with D = C / (k N^p):
    a log grid over N_range, then a bounded refinement. Also the closed-form exponent
    N_opt ~ C^(b / (a + p b)) with its error."""
    if "skipped" in nd_fit:
        return {"skipped": "no L(N, D) fit: " + nd_fit["skipped"]}
    if "skipped" in fpt_model:
        return {"skipped": fpt_model["skipped"]}
    k, p = fpt_model["k"], fpt_model["p"]
    lo, hi = math.log(N_range[0]), math.log(N_range[1])
    grid = np.linspace(lo, hi, 801)

    def loss(lnN, C):
        N = np.exp(lnN)
        return predict_nd_law(nd_fit, N, C / (k * N ** p))

    points = []
    for C in C_grid:
        i = int(np.argmin(loss(grid, C)))
        a_, b_ = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        res = minimize_scalar(lambda z: float(loss(z, C)), bounds=(a_, b_), method="bounded")
        N_opt = float(math.exp(res.x))
        points.append({"C": float(C), "N_opt": N_opt, "D_opt": float(C / (k * N_opt ** p)),
                       "L_opt": float(res.fun),
                       "at_search_edge": bool(i == 0 or i == len(grid) - 1)})
    prm, cov = nd_fit["params"], np.array(nd_fit["cov"])
    a, b = prm["a"]["value"], prm["b"]["value"]
    denom = a + p * b
    alpha = b / denom if denom > 0 else math.nan
    grad = np.array([-b / denom ** 2, a / denom ** 2]) if denom > 0 else np.full(2, math.nan)
    var = float(grad @ cov[np.ix_([2, 4], [2, 4])] @ grad)  # grad: d alpha / d(a, b)
    return {"relation": "C = k * N^p * D", "flops_per_token": fpt_model,
            "exponent": {"value": alpha, "stderr": math.sqrt(var) if var >= 0 and math.isfinite(var) else None},
            "exponent_formula": "N_opt ~ C^(b / (a + p b))", "N_search_range": list(N_range),
            "points": points}


def optimal_size_empirical(curves, C_grid):
    """At each C of C_grid, the run whose validation curve (interpolated in log C) is lowest,
    among the runs whose curve reaches C; levels reached by fewer than 2 runs are left out.
    curves: list of (run name, N, C array, L array)."""
    out = []
    for C in C_grid:
        best, reached = None, 0
        for name, N, Cs, Ls in curves:
            if Cs.size < 1 or not (Cs[0] <= C * (1 + 1e-9) and C <= Cs[-1] * (1 + 1e-9)):
                continue
            reached += 1
            Lc = float(np.interp(math.log(C), np.log(Cs), Ls))
            if best is None or Lc < best[2]:
                best = (name, N, Lc)
        if reached >= 2:
            out.append({"C": float(C), "N": float(best[1]), "run": best[0], "loss": best[2],
                        "runs_compared": reached})
    return out


def compare_at_compute(fit_nsa, fit_dense, C):
    """NSA vs dense at compute C from two compute-law fits: predicted losses, their difference
    and ratio (errors added in quadrature, the fits being independent), and the compute dense
    needs to reach NSA's loss."""
    l_n, s_n = predict_compute_law(fit_nsa, C)
    l_d, s_d = predict_compute_law(fit_dense, C)
    diff_err = math.hypot(s_n, s_d)
    ratio = l_n / l_d
    ratio_err = ratio * math.hypot(s_n / l_n, s_d / l_d)
    C_dense = compute_for_loss(fit_dense, l_n)
    return {"C": C, "loss_nsa": {"value": l_n, "stderr": s_n},
            "loss_dense": {"value": l_d, "stderr": s_d},
            "difference_nsa_minus_dense": {"value": l_n - l_d, "stderr": diff_err},
            "ratio_nsa_over_dense": {"value": ratio, "stderr": ratio_err},
            "dense_compute_for_nsa_loss": C_dense,
            "compute_multiplier": C_dense / C if math.isfinite(C_dense) else math.nan}


# ----------------------------------------------------------------------------------------------
# The analysis of one attention kind
# ----------------------------------------------------------------------------------------------

def log_grid(lo, hi, per_decade=8):
    """A log grid from lo to hi with about per_decade points a decade (at least 2)."""
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        return np.array([lo]) if math.isfinite(lo) and lo > 0 else np.array([])
    n = max(2, int(math.ceil(math.log10(hi / lo) * per_decade)) + 1)
    return np.logspace(math.log10(lo), math.log10(hi), n)


def nd_points(runs):
    """The L(N, D) fit's points: each done run's validation points after its first third
    (step > steps / 3; the warmup and the fast early drop stay out) and its final validation
    loss at D = tokens when the curve lacks it. Points with an unknown N or D are left out."""
    N, D, L = [], [], []
    for r in runs:
        curve = eval_curve(r)
        total = r["steps"] if math.isfinite(r["steps"]) else (curve["step"][-1] if curve["step"].size else math.nan)
        pts = [(r["params_nonembed"], t, l) for s, t, l in zip(curve["step"], curve["tokens"], curve["L"])
               if s > total / 3]
        if math.isfinite(r["final_val_loss"]) and not np.any(curve["step"] == total):
            pts.append((r["params_nonembed"], r["tokens"], r["final_val_loss"]))
        for n, d, l in pts:
            if math.isfinite(n) and math.isfinite(d):
                N.append(n), D.append(d), L.append(l)
    return np.array(N, dtype=float), np.array(D, dtype=float), np.array(L, dtype=float)


def validation_points(runs):
    """Every validation point (step > 0, known compute) of the runs as (C, L, run, step), and
    each run's curve as (run, N, C array, L array)."""
    points, curves = [], []
    for r in runs:
        c = eval_curve(r)
        ok = np.isfinite(c["C"]) & (c["C"] > 0)
        points += [(float(C), float(L), r["run"], int(s)) for C, L, s in zip(c["C"][ok], c["L"][ok], c["step"][ok])]
        if np.any(ok):
            curves.append((r["run"], r["params_nonembed"], c["C"][ok], c["L"][ok]))
    return points, curves


def nd_law_for(runs):
    """fit_nd_law on nd_points when the grid has 2 sizes and 2 token budgets among the runs."""
    n_sizes = len({r["params_nonembed"] for r in runs if math.isfinite(r["params_nonembed"])})
    n_budgets = len({r["tokens"] for r in runs if math.isfinite(r["tokens"])})
    N, D, L = nd_points(runs)
    if n_sizes < 2 or n_budgets < 2:
        fit = {"law": "L(N, D) = E + A / N^a + B / D^b", "n_points": int(L.size),
               "skipped": (f"the grid has {n_sizes} model size(s) and {n_budgets} token "
                           "budget(s) among done runs, needs at least 2 of each")}
    else:
        fit = fit_nd_law(N, D, L)
    fit["points_used"] = ("final validation loss of each done run plus its validation "
                          "points after the first third of its steps")
    return fit


def optimal_sizes_for(runs, curves, nd_fit, per_decade):
    """Empirical and fitted compute-optimal sizes over the compute range of the runs."""
    ends = [c[2][0] for c in curves] + [c[2][-1] for c in curves] + [run_flops(r) for r in runs]
    ends = [e for e in ends if math.isfinite(e) and e > 0]
    C_grid = log_grid(min(ends), max(ends), per_decade) if ends else np.array([])
    known = [r for r in runs if math.isfinite(r["params_nonembed"])]
    sizes = [r["params_nonembed"] for r in known]
    out = {"empirical": optimal_size_empirical(curves, C_grid)}
    if sizes and C_grid.size:
        fpt = fit_flops_per_token(sizes, [r["flops_per_token"] for r in known])
        out["fitted"] = optimal_size_fitted(nd_fit, fpt, C_grid, (min(sizes) / 100, max(sizes) * 100))
    else:
        out["fitted"] = {"skipped": "no model size or compute known"}
    return out


def analyse_attention(runs, bins_per_decade):
    """Frontier, compute law, L(N, D), optimal sizes for the done runs of one attention kind."""
    points, curves = validation_points(runs)
    front = frontier([p[0] for p in points], [p[1] for p in points], bins_per_decade)
    out = {"runs": [r["run"] for r in runs],
           "frontier": {"C": front["C"].tolist(), "L": front["L"].tolist(),
                        "run": [points[i][2] for i in front["index"]],
                        "step": [points[i][3] for i in front["index"]],
                        "bins_per_decade": bins_per_decade}}
    out["compute_law"] = fit_compute_law(front["C"], front["L"])
    if not points:
        out["compute_law"]["skipped"] = "no validation points (step > 0) with a known compute"
    out["nd_law"] = nd_law_for(runs)
    out["optimal_size"] = optimal_sizes_for(runs, curves, out["nd_law"], bins_per_decade)
    return out


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------

def attention_style(att):
    return ATTENTION_STYLE.get(att, ("tab:green", "^", ":"))


def compute_law_label(att, fit):
    p = fit["params"]
    return f"{att}: L = {p['E']['value']:.3g} + {p['A']['value']:.3g}·C^-{p['a']['value']:.3g}"


def note(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10,
            color="0.3", wrap=True)


def finish_plot(fig, ax, xlabel, ylabel, title, path):
    """Labels, a light grid, and the PNG written (the figure closed)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_loss_curves(runs, path):
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    sizes = [r["params"] for r in runs if math.isfinite(r["params"]) and r["params"] > 0]
    norm = LogNorm(min(sizes), max(sizes) * 1.0001) if sizes else None
    cmap = plt.get_cmap("viridis")
    drawn = 0
    for r in runs:
        color = cmap(norm(r["params"])) if norm and math.isfinite(r["params"]) and r["params"] > 0 else "0.5"
        style = attention_style(r["attention"])[2]
        tok, loss = train_curve(r)
        if tok.size:
            ax.plot(tok, loss, color=color, linestyle=style, alpha=0.2, linewidth=0.8)
        c = eval_curve(r)
        ok = np.isfinite(c["tokens"]) & (c["tokens"] > 0)
        if np.any(ok):
            label = r["run"] + ("" if r["status"] == "done" else f" ({r['status']})")
            ax.plot(c["tokens"][ok], c["L"][ok], color=color, linestyle=style, marker=".",
                    markersize=4, linewidth=1.5, label=label)
            drawn += 1
    if drawn:
        ax.set_xscale("log")
        ax.legend(fontsize=6 if drawn > 8 else 8, ncol=1 + drawn // 12, loc="best")
    else:
        note(ax, "no validation points to plot")
    if norm:
        sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(sm, ax=ax, label="parameters")
    finish_plot(fig, ax, "tokens seen", "loss (validation; faint: train)",
                "loss curves (solid: nsa, dashed: dense)", path)


def plot_loss_vs_flops(done, analyses, path):
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    any_point = False
    for att, an in analyses.items():
        color, marker, style = attention_style(att)
        group = [r for r in done if r["attention"] == att]
        for r in group:
            c = eval_curve(r)
            ok = np.isfinite(c["C"]) & (c["C"] > 0)
            ax.plot(c["C"][ok], c["L"][ok], color=color, alpha=0.15, linewidth=0.8)
        xs = [run_flops(r) for r in group]
        ys = [final_val_loss(r) for r in group]
        pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and x > 0 and math.isfinite(y)]
        if pts:
            any_point = True
            ax.scatter(*zip(*pts), color=color, marker=marker, s=60, edgecolors="black", zorder=5,
                       label=f"{att}: final val loss of each run")
        fr = an["frontier"]
        if fr["C"]:
            ax.scatter(fr["C"], fr["L"], facecolors="none", edgecolors=color, marker=marker, s=30,
                       linewidths=1.2, zorder=4, label=f"{att}: frontier (lowest loss per compute)")
        fit = an["compute_law"]
        if "skipped" not in fit:
            lo, hi = fit["C_range"]
            Cs = np.logspace(math.log10(lo) - 0.3, math.log10(hi) + 0.3, 200)
            Ls = [predict_compute_law(fit, C)[0] for C in Cs]
            ax.plot(Cs, Ls, color=color, linestyle=style, linewidth=1.5, label=compute_law_label(att, fit))
    if any_point:
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    else:
        note(ax, "no done run with a validation loss and known FLOPs")
    finish_plot(fig, ax, "training FLOPs", "validation loss", "loss against compute (faint: validation curves)",
                path)


def plot_optimal_size(analyses, path):
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    drawn = False
    for att, an in analyses.items():
        color, marker, style = attention_style(att)
        fitted = an["optimal_size"]["fitted"]
        if "skipped" not in fitted and fitted["points"]:
            e = fitted["exponent"]
            err = f" ± {e['stderr']:.2g}" if e["stderr"] is not None else ""
            ax.plot([p["C"] for p in fitted["points"]], [p["N_opt"] for p in fitted["points"]],
                    color=color, linestyle=style, label=f"{att}: from L(N, D), N_opt ~ C^{e['value']:.3g}{err}")
            drawn = True
        emp = an["optimal_size"]["empirical"]
        if emp:
            hollow = att != "nsa"  # so that equal sizes of nsa and dense both show
            ax.scatter([p["C"] for p in emp], [p["N"] for p in emp], marker=marker, zorder=3,
                       s=90 if hollow else 40, linewidths=1.5, edgecolors=color,
                       facecolors="none" if hollow else color, label=f"{att}: best run at each compute")
            drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    else:
        note(ax, "no compute-optimal size: no L(N, D) fit and no compute level reached by 2 runs")
    finish_plot(fig, ax, "training FLOPs", "compute-optimal non-embedding parameters",
                "compute-optimal model size", path)


def plot_throughput(runs, path):
    shown = [r for r in runs if math.isfinite(r["tokens_per_s"])]
    shown.sort(key=lambda r: (r["layout"], r["run"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 5), dpi=100, gridspec_kw={"width_ratios": [3, 2]})
    layouts = sorted({r["layout"] for r in shown})
    colors = {lay: plt.get_cmap("tab10")(i % 10) for i, lay in enumerate(layouts)}
    names = [r["run"] for r in shown]
    if shown:
        ax1.bar(range(len(shown)), [r["tokens_per_s"] for r in shown],
                color=[colors[r["layout"]] for r in shown])
        ax1.set_xticks(range(len(shown)))
        ax1.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        handles = [Patch(color=colors[lay], label=lay or "(no layout)") for lay in layouts]
        ax1.legend(handles=handles, fontsize=7, title="layout", title_fontsize=7)
    else:
        note(ax1, "no run has a throughput")
    ax1.set_ylabel("tokens/s")
    ax1.set_title("throughput")
    mfu = [r["mfu"] if math.isfinite(r["mfu"]) else 0.0 for r in shown]
    if any(m > 0 for m in mfu):
        ax2.bar(range(len(shown)), [100 * m for m in mfu], color=[colors[r["layout"]] for r in shown])
        ax2.set_xticks(range(len(shown)))
        ax2.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax2.set_ylabel("MFU (%)")
    else:
        note(ax2, "MFU is 0 or unknown for every run\n(on the CPU no peak FLOP/s\nis known to compare with)")
        ax2.set_xticks([])
        ax2.set_yticks([])
    ax2.set_title("model FLOPs utilisation")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# fit.json and summary.md
# ----------------------------------------------------------------------------------------------

def json_clean(x):
    """Non-finite floats -> None (JSON has no NaN), numpy scalars -> Python numbers."""
    if isinstance(x, dict):
        return {k: json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_clean(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def fmt_pm(v, s):
    """v ± s with the error to 2 significant digits ("0.123 ± 0.031", "(3.4 ± 0.5)e+04")."""
    if v is None or not math.isfinite(v):
        return "n/a"
    if s is None or not math.isfinite(s) or s <= 0:
        return f"{v:.4g} (no error estimate)"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        exp = int(math.floor(math.log10(abs(v)))) if v != 0 else 0
        inner = fmt_pm(v / 10 ** exp, s / 10 ** exp)
        return f"({inner})e{exp:+03d}"
    digits = max(0, 1 - int(math.floor(math.log10(s))))
    return f"{v:.{digits}f} ± {s:.{digits}f}"


def fmt_si(x):
    """1234567 -> 1.23M."""
    if x is None or not math.isfinite(x):
        return "–"
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_sci(x):
    return "–" if x is None or not math.isfinite(x) else f"{x:.3g}"


def pm(param):
    if param.get("at_bound"):
        return f"{param['value']:.3g} (at its bound)"
    return fmt_pm(param["value"], param["stderr"])


def summary_runs(sweep_dir, rows, done, axes):
    lines = ["# Scaling sweep report", "", f"Sweep directory: `{os.path.abspath(sweep_dir)}`", ""]
    not_done = [r for r in rows if r["status"] != "done"]
    lines.append(f"Runs: {len(done)} done, {len(not_done)} not done, {len(rows)} in all. "
                 "Only done runs enter the fits. N is the non-embedding parameter count "
                 "(`params_nonembed`), D the tokens seen, C the training FLOPs.")
    lines.append("")
    if not_done:
        lines.append("Not done:")
        lines.append("")
        lines += [f"- `{r['run']}`: {r['status'] or '(no status)'}" for r in not_done]
        lines.append("")
    problems = []
    for r in rows:
        m = r["metrics"]
        if m["missing"] and r["status"] in ("done", "running", "interrupted"):
            problems.append(f"- `{r['run']}`: no metrics.jsonl")
        if m["bad_lines"]:
            problems.append(f"- `{r['run']}`: {m['bad_lines']} unreadable line(s) in metrics.jsonl skipped")
    if problems:
        lines += ["Metrics problems:", ""] + problems + [""]
    if done:
        lines += ["## Done runs", ""]
        head = ["run"] + (["axes"] if axes else []) + ["attention", "params", "N (non-emb.)", "tokens",
                                                       "FLOPs", "final val loss", "tokens/s"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in done:
            cells = [f"`{r['run']}`"]
            if axes:
                cells.append(", ".join(f"{a}={v}" for a, v in r["axes"].items()))
            fv = final_val_loss(r)
            cells += [r["attention"], fmt_si(r["params"]), fmt_si(r["params_nonembed"]), fmt_si(r["tokens"]),
                      fmt_sci(run_flops(r)), f"{fv:.4f}" if math.isfinite(fv) else "–", fmt_si(r["tokens_per_s"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def summary_fit_table(analyses, key, names, title):
    atts = list(analyses)
    lines = [f"| {title} | " + " | ".join(atts) + " |", "|---|" + "---|" * len(atts)]
    for name in names:
        cells = []
        for att in atts:
            fit = analyses[att][key]
            cells.append("skipped" if "skipped" in fit else pm(fit["params"][name]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for extra, fmt in (("n_points", str), ("rms_log_residual", lambda v: f"{v:.2g}")):
        cells = []
        for att in atts:
            v = analyses[att][key].get(extra)
            cells.append(fmt(v) if v is not None and "skipped" not in analyses[att][key] else "–")
        lines.append(f"| {extra.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return lines + [""]


def summary_fits(analyses, comparison):
    lines = ["## Loss against compute: L(C) = E + A · C^(-a)", "",
             "Fitted on the compute frontier (lower envelope of all validation points of the done runs, "
             "C = flops_per_token × step × tokens_per_step), least squares on log L, 1-sigma errors.", ""]
    lines += summary_fit_table(analyses, "compute_law", ["E", "A", "a"], "parameter")
    for att, an in analyses.items():
        fit = an["compute_law"]
        if "skipped" not in fit:
            p = fit["params"]
            lines.append(f"- {att}: loss falls as C^-a with a = {pm(p['a'])} towards an irreducible "
                         f"E = {pm(p['E'])} ({fit['n_points']} frontier points, C from "
                         f"{fit['C_range'][0]:.3g} to {fit['C_range'][1]:.3g}).")
            if fit["at_bounds"]:
                lines.append(f"  Warning: {', '.join(fit['at_bounds'])} ended on a bound of the fit; "
                             "its error means little.")
    lines.append("")
    if comparison:
        lines += ["## NSA vs dense at equal compute", ""]
        if "skipped" in comparison:
            lines.append(f"Not compared: {comparison['skipped']}.")
        else:
            c = comparison
            mult = c["compute_multiplier"]
            lines.append(
                f"At C = {c['C']:.3g} FLOPs (the largest of the sweep) the fits predict nsa "
                f"{pm(c['loss_nsa'])} and dense {pm(c['loss_dense'])}: nsa − dense = "
                f"{pm(c['difference_nsa_minus_dense'])}, nsa / dense = {pm(c['ratio_nsa_over_dense'])}. "
                + (f"Dense would need {mult:.3g}× that compute to reach nsa's loss."
                   if math.isfinite(mult) else "Dense's fit does not reach nsa's loss (below its E)."))
        lines.append("")
    lines += ["## Loss against size and data: L(N, D) = E + A / N^a + B / D^b", "",
              "Points: the final validation loss of every done run plus the validation points along "
              "each run's curve after the first third of its steps (a point part-way through a run "
              "stands for a run of that length, though its learning rate has not decayed yet).", ""]
    lines += summary_fit_table(analyses, "nd_law", ["E", "A", "a", "B", "b"], "parameter")
    for att, an in analyses.items():
        fit = an["nd_law"]
        if "skipped" not in fit:
            p = fit["params"]
            lines.append(f"- {att}: loss falls as N^-a with a = {pm(p['a'])} in parameters and as D^-b "
                         f"with b = {pm(p['b'])} in tokens, towards E = {pm(p['E'])}.")
            if fit["at_bounds"]:
                lines.append(f"  Warning: {', '.join(fit['at_bounds'])} ended on a bound of the fit.")
    lines.append("")
    return lines


def summary_optimal(analyses):
    lines = ["## Compute-optimal size", ""]
    for att, an in analyses.items():
        fitted, emp = an["optimal_size"]["fitted"], an["optimal_size"]["empirical"]
        if "skipped" not in fitted:
            f = fitted["flops_per_token"]
            pts = fitted["points"]
            edge = any(p["at_search_edge"] for p in pts)
            lines.append(f"- {att}: from L(N, D) with C = flops_per_token(N) × D, flops_per_token = "
                         f"{f['k']:.3g} · N^{f['p']:.3g}: N_opt grows as C^{pm(fitted['exponent'])}; "
                         f"at C = {pts[0]['C']:.3g}: N_opt = {fmt_si(pts[0]['N_opt'])}, at C = "
                         f"{pts[-1]['C']:.3g}: N_opt = {fmt_si(pts[-1]['N_opt'])}"
                         + (" (some optima at the edge of the search range: extrapolated)" if edge else "") + ".")
        if emp:
            lines.append(f"- {att}, best run at each compute: "
                         + "; ".join(f"C {p['C']:.3g}: `{p['run']}` (N {fmt_si(p['N'])})" for p in emp) + ".")
        if "skipped" in fitted and not emp:
            lines.append(f"- {att}: none (no L(N, D) fit, no compute level reached by 2 runs).")
    return lines + [""]


def summary_skipped(analyses, comparison):
    lines = []
    for att, an in analyses.items():
        for key, what in (("compute_law", "L(C)"), ("nd_law", "L(N, D)")):
            if "skipped" in an[key]:
                lines.append(f"- {att} {what}: {an[key]['skipped']}")
        if "skipped" in an["optimal_size"]["fitted"]:
            lines.append(f"- {att} fitted optimal size: {an['optimal_size']['fitted']['skipped']}")
    if comparison and "skipped" in comparison:
        lines.append(f"- NSA vs dense: {comparison['skipped']}")
    if not analyses:
        lines.append("- all fits: no done runs")
    return (["## Skipped fits", ""] + lines + [""]) if lines else []


def write_summary(path, sweep_dir, rows, done, axes, analyses, comparison):
    lines = summary_runs(sweep_dir, rows, done, axes)
    if analyses:
        lines += summary_fits(analyses, comparison)
        lines += summary_optimal(analyses)
    lines += summary_skipped(analyses, comparison)
    lines += ["## Plots", "",
              "![loss curves](plots/loss_curves.png)", "",
              "![loss vs FLOPs](plots/loss_vs_flops.png)", "",
              "![optimal size](plots/optimal_size.png)", "",
              "![throughput](plots/throughput.png)", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def make_comparison(analyses, done):
    if "nsa" not in analyses or "dense" not in analyses:
        return None
    fn, fd = analyses["nsa"]["compute_law"], analyses["dense"]["compute_law"]
    if "skipped" in fn or "skipped" in fd:
        return {"skipped": "needs both compute-law fits, "
                + ("nsa: " + fn["skipped"] if "skipped" in fn else "dense: " + fd["skipped"])}
    flops = [run_flops(r) for r in done]
    flops = [f for f in flops if math.isfinite(f) and f > 0]
    C = max(flops) if flops else max(fn["C_range"][1], fd["C_range"][1])
    return compare_at_compute(fn, fd, C)


def report(sweep_dir, bins_per_decade=8):
    """Reads the sweep, fits, plots, writes fit.json and summary.md; returns the paths written."""
    rows, axes = load_sweep(sweep_dir)
    done = [r for r in rows if r["status"] == "done"]
    kinds = sorted({r["attention"] for r in done},
                   key=lambda a: (ATTENTION_ORDER.index(a) if a in ATTENTION_ORDER else 99, a))
    analyses = {att: analyse_attention([r for r in done if r["attention"] == att], bins_per_decade)
                for att in kinds}
    comparison = make_comparison(analyses, done)

    plots = os.path.join(sweep_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    written = [os.path.join(plots, n) for n in
               ("loss_curves.png", "loss_vs_flops.png", "optimal_size.png", "throughput.png")]
    plot_loss_curves(rows, written[0])
    plot_loss_vs_flops(done, analyses, written[1])
    plot_optimal_size(analyses, written[2])
    plot_throughput(rows, written[3])

    fit = {"sweep_dir": os.path.abspath(sweep_dir), "axes": axes,
           "N": "params_nonembed", "C": "flops_per_token * step * tokens_per_step",
           "runs": {"total": len(rows), "done": [r["run"] for r in done],
                    "not_done": [{"run": r["run"], "status": r["status"]} for r in rows if r["status"] != "done"],
                    "unreadable_metrics_lines": {r["run"]: r["metrics"]["bad_lines"]
                                                 for r in rows if r["metrics"]["bad_lines"]}},
           "attention": analyses, "nsa_vs_dense": comparison}
    fit_path = os.path.join(sweep_dir, "fit.json")
    with open(fit_path, "w") as f:
        json.dump(json_clean(fit), f, indent=1)
    summary_path = os.path.join(sweep_dir, "summary.md")
    write_summary(summary_path, sweep_dir, rows, done, axes, analyses, comparison)
    return [fit_path, summary_path] + written, fit


def print_outcome(paths, fit):
    print("wrote " + ", ".join(paths))
    runs = fit["runs"]
    print(f"runs: {len(runs['done'])} done, {len(runs['not_done'])} not done")
    for att, an in fit["attention"].items():
        for key in ("compute_law", "nd_law"):
            f = an[key]
            if "skipped" in f:
                print(f"{att} {f['law']}: skipped ({f['skipped']})")
            else:
                vals = ", ".join(f"{k} = {pm(v)}" for k, v in f["params"].items() if k != "A_ref")
                print(f"{att} {f['law']}: {vals}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Scaling-law fits and plots of a sweep directory.")
    ap.add_argument("--dir", required=True, help="the sweep directory (holds results.csv)")
    ap.add_argument("--bins-per-decade", type=int, default=8, help="compute bins for the frontier")
    args = ap.parse_args(argv)
    if args.bins_per_decade < 1:
        print("report_fit.py: --bins-per-decade must be at least 1", file=sys.stderr)
        return 2
    try:
        paths, fit = report(args.dir, args.bins_per_decade)
    except InputError as e:
        print(f"report_fit.py: {e}", file=sys.stderr)
        return 2
    print_outcome(paths, fit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
