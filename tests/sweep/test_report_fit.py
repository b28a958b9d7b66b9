#!/usr/bin/env python3
"""launch/sweep/report_fit.py: the scaling-law fits recover known laws, the frontier is the lower
envelope, degenerate input is skipped with a reason, metrics.jsonl is read as documented (last
record of a step wins, unreadable lines counted), and the script turns a synthetic sweep
directory into fit.json, summary.md and four plots.

usage: test_report_fit.py [--seed S]   (a fresh seed by default, printed; --nsatron is ignored)

Tolerances (each was set from 200 seeds of the same draw, about 3x the largest error seen there,
and several times the fit's own standard error; every fitted value must also lie within 8 of its
reported standard errors, checking that those are not too small):
  L(C) = E + A C^-a, 20 points over 4 decades of C:
    a = 0.3 and 0.6 with 0.2% noise: a within 5% (largest seen 1.4%), E within 0.05 (0.015);
    a = 0.15 with 0.1% noise: a within 8% (a small exponent over 4 decades trades off with E).
    A within 50%: A = A_ref C_ref^a multiplies the error of a by ln C_ref (about 40).
  L(N, D) = E + A/N^a + B/D^b, 5 x 6 grid over 2 decades of N and D, 0.2% noise:
    a and b within 10% (largest seen 2.4%, 4.7%), E within 0.15 (0.06).
  End to end (3 sizes x 2 budgets per attention, 0.1% noise on the validation losses):
    the compute exponent of the frontier within 20% of the ideal a b / (a + b): the frontier of
    3 sizes is the envelope of 3 curves, not the ideal envelope over all sizes, and the smallest
    and largest size bend its ends; on 60 seeds the fit came out 3-5% high for the nsa law and
    9-10% high for the dense one (its larger B moves the optimum). L(N, D)'s a and b within 10%
    (largest error seen 3.7%).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch", "sweep", "report_fit.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import report_fit as rf  # noqa: E402

PYTHON = "/usr/bin/python3"
Z_MAX = 8.0  # a fitted value this many of its standard errors away means the errors are wrong


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def check_within_errors(fit, truth, what):
    for name, value in truth.items():
        p = fit["params"][name]
        check(p["stderr"] is not None and p["stderr"] > 0, f"{what}: no standard error for {name}: {p}")
        z = abs(p["value"] - value) / p["stderr"]
        check(z < Z_MAX, f"{what}: {name} = {p['value']:.5g} ± {p['stderr']:.2g} is {z:.1f} sigma "
                         f"from the true {value:.5g}")


def test_compute_law(rng):
    C = np.logspace(15, 19, 20)
    C0 = 1e17
    for a, noise, tol_a in ((0.3, 0.002, 0.05), (0.6, 0.002, 0.05), (0.15, 0.001, 0.08)):
        E, A = 1.7, C0 ** a  # the reducible loss is 1 at C0
        L = (E + A * C ** -a) * np.exp(rng.normal(0.0, noise, C.size))
        fit = rf.fit_compute_law(C, L)
        check("skipped" not in fit, f"compute law a={a}: skipped: {fit.get('skipped')}")
        p = fit["params"]
        what = f"compute law a={a}, noise {noise:.1%}"
        check(abs(p["a"]["value"] / a - 1) < tol_a, f"{what}: a = {p['a']['value']:.4f}, not within {tol_a:.0%}")
        check(abs(p["E"]["value"] - E) < 0.05, f"{what}: E = {p['E']['value']:.4f}, not within 0.05 of {E}")
        check(abs(p["A"]["value"] / A - 1) < 0.5, f"{what}: A = {p['A']['value']:.4g}, not within 50% of {A:.4g}")
        check_within_errors(fit, {"E": E, "A": A, "a": a}, what)
        Lp, s = rf.predict_compute_law(fit, 1e18)
        check(abs(Lp / (E + A * 1e18 ** -a) - 1) < 0.005 and s > 0,
              f"{what}: prediction at 1e18 {Lp:.4f} ± {s}, true {E + A * 1e18 ** -a:.4f}")
        print(f"  compute law a={a}: a = {rf.pm(p['a'])}, E = {rf.pm(p['E'])}, A = {rf.pm(p['A'])}")


def test_nd_law(rng):
    E, A, a, B, b = 1.7, 400.0, 0.34, 410.0, 0.28
    N, D = (g.ravel() for g in np.meshgrid(np.logspace(6, 8, 5), np.logspace(8, 10, 6)))
    L = (E + A * N ** -a + B * D ** -b) * np.exp(rng.normal(0.0, 0.002, N.size))
    fit = rf.fit_nd_law(N, D, L)
    check("skipped" not in fit, f"nd law: skipped: {fit.get('skipped')}")
    p = fit["params"]
    check(abs(p["a"]["value"] / a - 1) < 0.10, f"nd law: a = {p['a']['value']:.4f}, not within 10% of {a}")
    check(abs(p["b"]["value"] / b - 1) < 0.10, f"nd law: b = {p['b']['value']:.4f}, not within 10% of {b}")
    check(abs(p["E"]["value"] - E) < 0.15, f"nd law: E = {p['E']['value']:.4f}, not within 0.15 of {E}")
    check_within_errors(fit, {"E": E, "A": A, "a": a, "B": B, "b": b}, "nd law")
    # the fitted optimum follows the closed form N_opt ~ C^(b / (a + b)) with C = 6 N D
    opt = rf.optimal_size_fitted(fit, {"k": 6.0, "p": 1.0}, np.logspace(16, 20, 5), (1e4, 1e12))
    Ns = np.array([q["N_opt"] for q in opt["points"]])
    slope = np.polyfit(np.log(np.logspace(16, 20, 5)), np.log(Ns), 1)[0]
    fa, fb = p["a"]["value"], p["b"]["value"]
    check(abs(slope - fb / (fa + fb)) < 1e-3 and abs(opt["exponent"]["value"] - fb / (fa + fb)) < 1e-9,
          f"optimal size: numerical slope {slope:.4f}, closed form {opt['exponent']['value']:.4f}, "
          f"b/(a+b) = {fb / (fa + fb):.4f}")
    print(f"  nd law: a = {rf.pm(p['a'])}, b = {rf.pm(p['b'])}, E = {rf.pm(p['E'])}; "
          f"N_opt ~ C^{rf.pm(opt['exponent'])}")


def test_frontier():
    # one bin a decade: [1, 10), [10, 100), [100, 1000), [1000, 10000)
    C = [1.0, 2.0, 5.0, 20.0, 30.0, 200.0, 500.0, 3000.0, 5000.0, math.nan, -1.0]
    L = [5.0, 4.0, 4.5, 4.2, 3.8, 3.9, 3.95, 3.0, 2.0, 0.1, 0.1]
    f = rf.frontier(C, L, bins_per_decade=1)
    # bin minima: 4.0 at C=2, 3.8 at C=30, 3.9 at C=200 (not below 3.8: dropped), 2.0 at C=5000
    check(f["C"].tolist() == [2.0, 30.0, 5000.0] and f["L"].tolist() == [4.0, 3.8, 2.0]
          and f["index"].tolist() == [1, 4, 8], f"frontier: {f}")
    # a decade edge lands in the upper bin despite log10's rounding (log10(1000) < 3 in floats)
    f = rf.frontier([999.0, 1000.0], [2.0, 1.0], bins_per_decade=1)
    check(f["C"].tolist() == [999.0, 1000.0], f"frontier at a decade edge: {f}")
    f = rf.frontier([], [])
    check(f["C"].size == 0 and f["index"].size == 0, f"empty frontier: {f}")
    print("  frontier: lower envelope of a hand-made example")


def test_degenerate():
    C = np.logspace(15, 18, 10)
    cases = {
        "compute, 3 points": rf.fit_compute_law(C[:3], [3.0, 2.5, 2.2]),
        "compute, no points": rf.fit_compute_law([], []),
        "compute, NaN": rf.fit_compute_law(C, np.r_[np.full(9, 3.0), math.nan]),
        "compute, all-equal loss": rf.fit_compute_law(C, np.full(10, 2.5)),
        "compute, all-equal C": rf.fit_compute_law(np.full(10, 1e16), np.linspace(3, 2, 10)),
        "compute, negative loss": rf.fit_compute_law(C, np.linspace(1, -1, 10)),
        "nd, one size": rf.fit_nd_law(np.full(10, 1e6), np.logspace(8, 9, 10), np.linspace(3, 2, 10)),
        "nd, too few points": rf.fit_nd_law([1e6, 2e6, 1e6, 2e6], [1e8, 1e8, 2e8, 2e8], [3, 2.9, 2.8, 2.7]),
        "nd, inf": rf.fit_nd_law([1e6, 2e6] * 4, [1e8] * 4 + [2e8] * 4, [3, 2.9, 2.8, math.inf, 2, 2, 2, 2]),
        "nd, all-equal loss": rf.fit_nd_law([1e6, 2e6] * 4, [1e8] * 4 + [2e8] * 4, [2.5] * 8),
    }
    for name, fit in cases.items():
        check(isinstance(fit.get("skipped"), str) and fit["skipped"], f"degenerate {name}: not skipped: {fit}")
    opt = rf.optimal_size_fitted(cases["nd, one size"], {"k": 6.0, "p": 1.0}, [1e16], (1e5, 1e7))
    check("skipped" in opt, f"optimal size without a fit: {opt}")
    check(rf.optimal_size_empirical([], [1e16]) == [], "empirical optimum with no curves")
    check(json.loads(json.dumps(rf.json_clean({"x": math.nan, "y": [np.float64(1.5), math.inf]})))
          == {"x": None, "y": [1.5, None]}, "json_clean")
    print("  degenerate inputs: " + "; ".join(f"{k}: {v['skipped']}" for k, v in list(cases.items())[:4]) + "; ...")


def test_read_metrics():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "metrics.jsonl")
        with open(path, "w") as f:
            f.write('{"step": 0, "val_loss": 5.5}\n')
            f.write('{"step": 10, "loss": 4.0, "tokens": 100}\n')
            f.write('{"step": 10, "val_loss": 4.4}\n')
            f.write('{"step": 20, "loss": 3.0, "tok')  # killed mid-line, then resumed
            f.write('{"step": 10, "loss": 3.9, "tokens": 100}\n')  # the restart repeats step 10
            f.write('{"step": 10, "val_loss": 4.3}\n')
            f.write('{"step": 20, "val_loss": nan}\n')  # what a C++ stream writes for NaN
            f.write('[1, 2]\n\n')
            f.write('{"step": 20, "loss": 3.1, "tokens": 200}\n{"step": 20, "val_loss": 3.5}\n')
        m = rf.read_metrics(path)
        check(m["evals"] == {0: 5.5, 10: 4.3, 20: 3.5}, f"read_metrics evals: {m['evals']}")
        check(sorted(m["steps"]) == [10, 20] and m["steps"][10]["loss"] == 3.9, f"read_metrics steps: {m['steps']}")
        check(m["bad_lines"] == 3 and not m["missing"], f"read_metrics bad lines: {m['bad_lines']}")
        check(rf.read_metrics(os.path.join(tmp, "none.jsonl"))["missing"], "read_metrics: missing file")
    print("  read_metrics: last record of a step wins, 3 unreadable lines counted")


# ---- end to end ------------------------------------------------------------------------------

LAW = {"E": 1.8, "A": 145.0, "a": 0.34, "B": 164.0, "b": 0.28}  # D_opt about 20 N near N = 4M
DENSE_B_FACTOR = 1.15  # the synthetic dense model needs more data for the same loss
SIZES = [1e6, 4e6, 16e6]
BUDGETS = {"1x": 20, "4x": 80}  # tokens = budget x N
HEADER = ("run,status,size,budget,attention,layout,device,params,params_nonembed,tokens,steps,"
          "tokens_per_step,flops_per_token,flops,final_train_loss,final_val_loss,tokens_per_s,mfu,wall_s")


def law_loss(N, D, attention):
    B = LAW["B"] * (DENSE_B_FACTOR if attention == "dense" else 1.0)
    return LAW["E"] + LAW["A"] * N ** -LAW["a"] + B * D ** -LAW["b"]


def write_run(sweep, name, attention, N, budget, rng, corrupt_tail):
    """One done run: metrics.jsonl with 10 evals and 40 step records; its results.csv row."""
    tokens_per_step = 8192
    steps = int(round(budget * N / tokens_per_step))
    fpt = 6.0 * N  # C = 6 N D exactly, so the ideal compute exponent is a b / (a + b)
    os.makedirs(os.path.join(sweep, name))
    lines, val = [], None
    for k in range(41):
        step = int(round(steps * k / 40))
        D = max(step, 1) * tokens_per_step
        train = law_loss(N, D, attention) * math.exp(rng.normal(0, 0.02)) + (3.0 if step == 0 else 0.0)
        if step > 0:
            lines.append(json.dumps({"step": step, "loss": train, "lr": 1e-3, "grad_norm": 1.0,
                                     "tokens_per_s": 1e5 / N ** 0.5, "ms_per_step": 10.0,
                                     "peak_mem_bytes": 1, "activation_peak_bytes": 1, "mfu": 0.0,
                                     "tokens": step * tokens_per_step, "skipped": False}))
        if k % 4 == 0:
            val = (law_loss(N, D, attention) * math.exp(rng.normal(0, 0.001)) if step > 0
                   else 5.6)
            lines.append(json.dumps({"step": step, "val_loss": val}))
    text = "\n".join(lines) + "\n"
    if corrupt_tail:
        text += '{"step": 999999, "val_loss": 0.0'  # a killed run's half-written last line
    with open(os.path.join(sweep, name, "metrics.jsonl"), "w") as f:
        f.write(text)
    emb = 256 * 128
    return (f"{name},done,{N:.0f},{budget},{attention},tp1.pp1.dp1,cpu,{N + emb:.0f},{N:.0f},"
            f"{steps * tokens_per_step},{steps},{tokens_per_step},{fpt:.0f},{fpt * steps * tokens_per_step:.6g},"
            f"{train:.5f},{val:.5f},{1e5 / N ** 0.5:.1f},0,12.5")


def make_sweep(sweep, rng):
    rows = [HEADER]
    for attention in ("nsa", "dense"):
        for i, N in enumerate(SIZES):
            for bname, budget in BUDGETS.items():
                name = f"{attention}-s{i}-{bname}"
                rows.append(write_run(sweep, name, attention, N, budget, rng,
                                      corrupt_tail=(name == "nsa-s1-4x")))
    rows.append("nsa-s3-1x,failed,64000000,1x,nsa,tp1.pp1.dp1,cpu,64032768,64000000,1280000000,"
                "156250,8192,384000000,4.9152e+17,,,,,")
    rows.append("dense-s3-1x,not started,64000000,1x,dense,tp1.pp1.dp1,cpu,64032768,64000000,1280000000,"
                "156250,8192,384000000,4.9152e+17,,,,,")
    with open(os.path.join(sweep, "results.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")


def run_script(*args):
    return subprocess.run([PYTHON, SCRIPT, *args], capture_output=True, text=True, timeout=120)


def test_end_to_end(rng):
    with tempfile.TemporaryDirectory() as tmp:
        sweep = os.path.join(tmp, "sweep")
        os.makedirs(sweep)
        make_sweep(sweep, rng)
        t0 = time.time()
        r = run_script("--dir", sweep)
        check(r.returncode == 0, f"report_fit.py exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        print(f"  end to end: report in {time.time() - t0:.1f} s; its output:")
        print("    " + r.stdout.strip().replace("\n", "\n    "))
        for name in ("fit.json", "summary.md", "plots/loss_curves.png", "plots/loss_vs_flops.png",
                     "plots/optimal_size.png", "plots/throughput.png"):
            path = os.path.join(sweep, name)
            check(os.path.isfile(path) and os.path.getsize(path) > 0, f"{name} not written")
        with open(os.path.join(sweep, "plots", "loss_curves.png"), "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "loss_curves.png is not a PNG")
        with open(os.path.join(sweep, "fit.json")) as f:
            fit = json.load(f)
        with open(os.path.join(sweep, "summary.md")) as f:
            summary = f.read()

        check("- `nsa-s3-1x`: failed" in summary and "- `dense-s3-1x`: not started" in summary,
              "summary.md does not list the runs not done")
        check(fit["runs"]["unreadable_metrics_lines"] == {"nsa-s1-4x": 1},
              f"unreadable lines: {fit['runs']['unreadable_metrics_lines']}")
        check(len(fit["runs"]["done"]) == 12 and {"run": "nsa-s3-1x", "status": "failed"} in fit["runs"]["not_done"],
              f"runs: {fit['runs']}")
        ideal = LAW["a"] * LAW["b"] / (LAW["a"] + LAW["b"])
        for attention in ("nsa", "dense"):
            law = fit["attention"][attention]["compute_law"]
            check("skipped" not in law, f"{attention} compute law skipped: {law.get('skipped')}")
            a = law["params"]["a"]["value"]
            check(abs(a / ideal - 1) < 0.20, f"{attention}: compute exponent {a:.4f}, ideal {ideal:.4f}")
            nd = fit["attention"][attention]["nd_law"]
            check("skipped" not in nd, f"{attention} L(N, D) skipped: {nd.get('skipped')}")
            for name in ("a", "b"):
                v = nd["params"][name]["value"]
                check(abs(v / LAW[name] - 1) < 0.10, f"{attention} L(N, D): {name} = {v:.4f}, true {LAW[name]}")
            check(fit["attention"][attention]["optimal_size"]["empirical"], f"{attention}: no empirical optimum")
            print(f"    {attention}: compute exponent {a:.4f} (ideal {ideal:.4f}); L(N, D) a = "
                  f"{nd['params']['a']['value']:.4f}, b = {nd['params']['b']['value']:.4f} "
                  f"(true {LAW['a']}, {LAW['b']})")
        cmp_ = fit["nsa_vs_dense"]
        check(cmp_ and "skipped" not in cmp_ and cmp_["difference_nsa_minus_dense"]["value"] < 0,
              f"nsa vs dense: {cmp_}")
        check("NSA vs dense at equal compute" in summary and "![loss curves](plots/loss_curves.png)" in summary,
              "summary.md lacks the comparison or the plot links")

        # not done runs only: a report with every fit skipped, still exit 0
        only = os.path.join(tmp, "nothing_done")
        os.makedirs(only)
        with open(os.path.join(only, "results.csv"), "w") as f:
            f.write(HEADER + "\nr0,running,1,1x,nsa,tp1.pp1.dp1,cpu,10,5,100,10,10,60,6000,,,,,\n")
        r = run_script("--dir", only)
        check(r.returncode == 0 and os.path.isfile(os.path.join(only, "plots", "throughput.png")),
              f"sweep with no done run: exit {r.returncode}: {r.stderr}")

        # input errors: exit 2 with a message
        for args, why in ((["--dir", os.path.join(tmp, "absent")], "missing directory"),
                          (["--dir", tmp], "missing results.csv")):
            r = run_script(*args)
            check(r.returncode == 2 and "report_fit.py:" in r.stderr, f"{why}: exit {r.returncode}: {r.stderr}")
        with open(os.path.join(tmp, "results.csv"), "w") as f:
            f.write("name,value\n")
        r = run_script("--dir", tmp)
        check(r.returncode == 2 and "column" in r.stderr, f"results.csv without run/status: exit {r.returncode}: {r.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None)
    args, _ = ap.parse_known_args()  # the test harness adds --nsatron PATH
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (rerun with --seed {seed})")
    rng = np.random.default_rng(seed)
    tests = [test_frontier, test_degenerate, test_read_metrics, lambda: test_compute_law(rng),
             lambda: test_nd_law(rng), lambda: test_end_to_end(rng)]
    try:
        for t in tests:
            t()
    except AssertionError as e:
        print(f"FAIL (seed {seed}): {e}", file=sys.stderr)
        return 1
    print("all report_fit checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
