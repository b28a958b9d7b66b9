#!/usr/bin/python3
"""PyTorch autograd oracle for the CPU op families (float64).

Generates fresh random inputs (the seed is printed; pass --seed to replay), runs them through
ops_oracle_driver (which calls the nsatron ops, forward and backward), and compares every
output and gradient with torch autograd in float64: max |ours - torch| <= 1e-10 * max |torch|
per array (for an output that a formula obtains by cancellation, the scale is the size of the
cancelling terms instead; each such case says so).

Run with Debian's interpreter (/usr/bin/python3: python3-torch, python3-h5py, numpy).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as F

RTOL = 1e-10


def t(a, grad=False):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


# ---- case generators: each returns (inputs dict, reference function) ----------------------
# The reference takes the inputs and returns a dict of expected outputs (numpy arrays).

def rmsnorm_case(rng, shape, eps):
    C = shape[-1]
    inp = dict(x=rng.standard_normal(shape), w=rng.standard_normal(C), dy=rng.standard_normal(shape),
               dw0=rng.standard_normal(C), eps=np.array([eps]))

    def ref(i):
        x, w = t(i["x"], True), t(i["w"], True)
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(i["eps"][0]))
        y = x * rstd * w
        (y * t(i["dy"])).sum().backward()
        # dx = rstd * (g - xhat * mean(g xhat)) cancels when C is small: its rounding error
        # scales with the terms |rstd * g|, not with the result.
        terms = (rstd * w * t(i["dy"])).detach().numpy()
        return dict(y=y.detach().numpy(), rstd=rstd.detach().numpy().reshape(-1), dx=x.grad.numpy(),
                    dw=i["dw0"] + w.grad.numpy(), _scale=dict(dx=terms))
    return inp, ref


def add_rmsnorm_case(rng, shape, eps):
    C = shape[-1]
    inp = dict(a=rng.standard_normal(shape), b=rng.standard_normal(shape), w=rng.standard_normal(C),
               dy=rng.standard_normal(shape), dh=rng.standard_normal(shape),
               dw0=rng.standard_normal(C), eps=np.array([eps]))

    def ref(i):
        a, b, w = t(i["a"], True), t(i["b"], True), t(i["w"], True)
        h = a + b
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + float(i["eps"][0])) * w
        ((y * t(i["dy"])).sum() + (h * t(i["dh"])).sum()).backward()
        rstd = torch.rsqrt(h.detach().pow(2).mean(-1, keepdim=True) + float(i["eps"][0]))
        terms = np.abs((rstd * w * t(i["dy"])).detach().numpy()) + np.abs(i["dh"])  # as in rmsnorm
        return dict(h=h.detach().numpy(), y=y.detach().numpy(), da=a.grad.numpy(), db=b.grad.numpy(),
                    dw=i["dw0"] + w.grad.numpy(), _scale=dict(da=terms, db=terms))
    return inp, ref


def swiglu_fused_case(rng, out_shape):
    u_shape = list(out_shape[:-1]) + [2 * out_shape[-1]]
    inp = dict(u=2 * rng.standard_normal(u_shape), dout=rng.standard_normal(out_shape))

    def ref(i):
        u = t(i["u"], True)
        a, b = u.chunk(2, dim=-1)
        out = F.silu(a) * b
        (out * t(i["dout"])).sum().backward()
        return dict(out=out.detach().numpy(), du=u.grad.numpy())
    return inp, ref


def swiglu_split_case(rng, shape):
    inp = dict(a=2 * rng.standard_normal(shape), b=rng.standard_normal(shape),
               dout=rng.standard_normal(shape))

    def ref(i):
        a, b = t(i["a"], True), t(i["b"], True)
        out = F.silu(a) * b
        (out * t(i["dout"])).sum().backward()
        return dict(out=out.detach().numpy(), da=a.grad.numpy(), db=b.grad.numpy())
    return inp, ref


def embedding_case(rng, V, C, token_shape):
    tokens = rng.integers(0, V, size=token_shape).astype(np.int32)
    inp = dict(table=rng.standard_normal((V, C)), tokens=tokens,
               dout=rng.standard_normal(tuple(token_shape) + (C,)), dtable0=rng.standard_normal((V, C)))

    def ref(i):
        table = t(i["table"], True)
        out = F.embedding(torch.from_numpy(i["tokens"].astype(np.int64)), table)
        (out * t(i["dout"])).sum().backward()
        return dict(out=out.detach().numpy(), dtable=i["dtable0"] + table.grad.numpy())
    return inp, ref


def cross_entropy_case(rng, shape, p_ignore, ignore_index):
    V = shape[-1]
    N = int(np.prod(shape[:-1]))
    targets = rng.integers(0, V, size=N).astype(np.int32)
    targets[rng.random(N) < p_ignore] = ignore_index
    targets[0] = rng.integers(0, V)  # at least one counted row (torch gives NaN otherwise)
    if targets[0] == ignore_index:
        targets[0] = (ignore_index + 1) % V
    inp = dict(logits=3 * rng.standard_normal(shape), targets=targets,
               ignore_index=np.array([float(ignore_index)]), dloss=np.array([rng.uniform(0.5, 2)]))

    def ref(i):
        z = t(i["logits"], True)
        loss = F.cross_entropy(z.reshape(-1, V), torch.from_numpy(i["targets"].astype(np.int64)),
                               ignore_index=int(i["ignore_index"][0]), reduction="mean")
        (loss * float(i["dloss"][0])).backward()
        lse = torch.logsumexp(z.detach().reshape(-1, V), dim=-1)
        L = loss.detach().numpy().reshape(1)
        return dict(loss=L, lse=lse.numpy(), dlogits=z.grad.numpy(), loss_fused=L,
                    dlogits_fused=z.grad.numpy())
    return inp, ref


def linear_case(rng, x_shape, out, bias):
    n_in = x_shape[-1]
    y_shape = tuple(x_shape[:-1]) + (out,)
    inp = dict(x=rng.standard_normal(x_shape), w=rng.standard_normal((out, n_in)),
               dy=rng.standard_normal(y_shape), dw0=rng.standard_normal((out, n_in)))
    if bias:
        inp.update(b=rng.standard_normal(out), db0=rng.standard_normal(out))

    def ref(i):
        x, w = t(i["x"], True), t(i["w"], True)
        b = t(i["b"], True) if "b" in i else None
        y = F.linear(x, w, b)
        (y * t(i["dy"])).sum().backward()
        r = dict(y=y.detach().numpy(), dx=x.grad.numpy(), dw=i["dw0"] + w.grad.numpy())
        if b is not None:
            r["db"] = i["db0"] + b.grad.numpy()
        return r
    return inp, ref


def adamw_case(rng, sizes, decays, steps, hp, grad_scale):
    n = sum(sizes)
    offsets = np.cumsum([0] + list(sizes[:-1])).astype(np.int32)
    inp = dict(param0=rng.standard_normal(n), grads=rng.standard_normal((steps, n)),
               seg_offset=offsets, seg_numel=np.array(sizes, dtype=np.int32),
               seg_decay=np.array(decays, dtype=np.int32), grad_scale=np.array([grad_scale]),
               **{k: np.array([v]) for k, v in hp.items()})

    def ref(i):
        params = [torch.nn.Parameter(t(i["param0"][o:o + s].copy())) for o, s in zip(offsets, sizes)]
        groups = [dict(params=[p for p, d in zip(params, decays) if d], weight_decay=hp["weight_decay"]),
                  dict(params=[p for p, d in zip(params, decays) if not d], weight_decay=0.0)]
        groups = [g for g in groups if g["params"]]
        opt = torch.optim.AdamW(groups, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
        for k in range(steps):
            for p, o, s in zip(params, offsets, sizes):
                p.grad = t(i["grads"][k, o:o + s] * grad_scale)
            opt.step()
        cat = lambda xs: np.concatenate([x.detach().numpy() for x in xs])
        return dict(param=cat(params), m=cat([opt.state[p]["exp_avg"] for p in params]),
                    v=cat([opt.state[p]["exp_avg_sq"] for p in params]))
    return inp, ref


def grad_norm_case(rng, shapes, max_norm):
    inp = {f"buf{k}": rng.standard_normal(s) for k, s in enumerate(shapes)}
    inp["max_norm"] = np.array([max_norm])

    def ref(i):
        params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes]
        for k, p in enumerate(params):
            p.grad = t(i[f"buf{k}"])
        norm = torch.nn.utils.clip_grad_norm_(params, float(i["max_norm"][0]))
        r = {f"buf{k}": p.grad.numpy() for k, p in enumerate(params)}
        r["norm"] = norm.detach().numpy().reshape(1)
        return r
    return inp, ref


def add_case(rng, shape):
    inp = dict(a=rng.standard_normal(shape), b=rng.standard_normal(shape))
    return inp, lambda i: dict(out=(t(i["a"]) + t(i["b"])).numpy())


def split_columns_case(rng, rows, widths):
    inp = dict(x=rng.standard_normal((rows, sum(widths))))
    for k, w in enumerate(widths):
        inp[f"dpart{k}"] = rng.standard_normal((rows, w))

    def ref(i):
        x = t(i["x"], True)
        parts = torch.split(x, list(widths), dim=1)
        sum((p * t(i[f"dpart{k}"])).sum() for k, p in enumerate(parts)).backward()
        r = {f"part{k}": p.detach().numpy() for k, p in enumerate(parts)}
        r["dx"] = x.grad.numpy()
        return r
    return inp, ref


def build_cases(rng):
    cases = []
    for shape, eps in [((1, 1), 1e-5), ((1, 7), 1e-5), ((3, 5), 1e-6), ((2, 3, 33), 1e-5), ((17, 64), 0.1)]:
        cases.append(("rmsnorm", *rmsnorm_case(rng, shape, eps)))
        cases.append(("add_rmsnorm", *add_rmsnorm_case(rng, shape, eps)))
    for shape in [(1, 1), (1, 5), (3, 7), (2, 3, 9), (8, 64)]:
        cases.append(("swiglu_fused", *swiglu_fused_case(rng, shape)))
        cases.append(("swiglu_split", *swiglu_split_case(rng, shape)))
    for V, C, ts in [(1, 1, (1,)), (5, 3, (1,)), (7, 9, (2, 5)), (3, 17, (40,)), (300, 8, (4, 33))]:
        cases.append(("embedding", *embedding_case(rng, V, C, ts)))
    for shape, p, ii in [((1, 1), 0.0, -100), ((1, 7), 0.0, -100), ((5, 3), 0.3, -100),
                         ((2, 3, 11), 0.25, -1), ((16, 257), 0.1, 3)]:
        cases.append(("cross_entropy", *cross_entropy_case(rng, shape, p, ii)))
    for xs, out, bias in [((1, 1), 1, True), ((1, 5), 3, False), ((4, 7), 9, True), ((2, 3, 5), 1, True),
                          ((13, 3), 17, False), ((33, 65), 31, True)]:
        cases.append(("linear", *linear_case(rng, xs, out, bias)))
    hp = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    cases.append(("adamw", *adamw_case(rng, [7, 1, 12, 3], [1, 0, 1, 0], 6, hp, 1.0)))
    cases.append(("adamw", *adamw_case(rng, [1], [1], 1, dict(hp, weight_decay=0.5), 1.0)))
    cases.append(("adamw", *adamw_case(rng, [64, 9], [0, 1], 4, dict(hp, lr=0.1, beta2=0.999), 0.37)))
    cases.append(("grad_norm", *grad_norm_case(rng, [(1,), (3, 5), (4097,)], 1.0)))
    cases.append(("grad_norm", *grad_norm_case(rng, [(7,), (2, 2)], 100.0)))  # no clipping
    cases.append(("add", *add_case(rng, (3, 5))))
    cases.append(("add", *add_case(rng, (1,))))
    for rows, widths in [(1, (1,)), (5, (3, 1, 7)), (33, (12, 4, 4, 4, 4, 4, 4, 6))]:
        cases.append(("split_columns", *split_columns_case(rng, rows, widths)))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--driver", required=True, help="path to ops_oracle_driver")
    ap.add_argument("--nsatron", help="the nsatron executable (unused; given by the test harness)")
    ap.add_argument("--seed", type=int, help="replay a seed instead of a fresh one")
    ap.add_argument("--keep", help="keep the HDF5 files in this directory")
    args = ap.parse_args()

    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"oracle_ops: seed {seed} (replay with --seed {seed})", flush=True)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    cases = build_cases(rng)

    workdir = args.keep or tempfile.mkdtemp(prefix="nsatron_oracle_")
    os.makedirs(workdir, exist_ok=True)
    fin, fout = os.path.join(workdir, "in.h5"), os.path.join(workdir, "out.h5")
    names = []
    with h5py.File(fin, "w") as f:
        for k, (op, inp, _) in enumerate(cases):
            name = f"{op}__{k:03d}"
            names.append(name)
            g = f.create_group(name)
            for key, val in inp.items():
                g.create_dataset(key, data=val)
    subprocess.run([args.driver, fin, fout], check=True)

    failures = 0
    worst, worst_at = 0.0, "-"
    with h5py.File(fout, "r") as f:
        for name, (op, inp, ref) in zip(names, cases):
            want = ref(inp)
            term_scale = want.pop("_scale", {})
            got = f[name]
            missing = set(want) - set(got.keys())
            if missing:
                print(f"FAIL {name}: missing outputs {sorted(missing)}")
                failures += 1
                continue
            for key, w in want.items():
                g = np.asarray(got[key])
                w = np.asarray(w, dtype=np.float64)
                if g.shape != w.shape and g.size == w.size:
                    g = g.reshape(w.shape)
                if g.shape != w.shape:
                    print(f"FAIL {name}/{key}: shape {g.shape} vs torch {w.shape}")
                    failures += 1
                    continue
                scale = np.max(np.abs(w)) if w.size else 0.0
                if key in term_scale:  # an output computed by cancellation: see its reference
                    scale = max(scale, float(np.max(np.abs(term_scale[key]))))
                err = np.max(np.abs(g - w)) if w.size else 0.0
                rel = err / scale if scale > 0 else err
                if rel > worst:
                    worst, worst_at = rel, f"{name}/{key}"
                shapes = {k: np.shape(v) for k, v in inp.items() if np.ndim(v) and np.size(v) > 1}
                if not rel <= RTOL:
                    print(f"FAIL {name}/{key}: max rel error {rel:.3e} > {RTOL:.0e} (inputs {shapes})")
                    failures += 1
    print(f"oracle_ops: {len(cases)} cases, worst relative error {worst:.3e} ({worst_at}), {failures} failures")
    if not args.keep:
        for p in (fin, fout):
            os.remove(p)
        os.rmdir(workdir)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
