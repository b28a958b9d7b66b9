#!/usr/bin/python3
"""PyTorch autograd oracle for the whole NSA transformer (core/model/model.h), float64.

For each case, with a FRESH seed per run (printed; --seed replays a run), model_oracle_driver
builds the engine's model in fp64 (its own init, or random normal weights so that norms and
gates sit away from trivial values), runs one forward_backward on a random batch and writes
the parameters, the batch, the loss and every gradient to HDF5. This script rebuilds the same
model in torch, independently, from the layer description of model.h:

  x0 = embedding[tokens]
  per layer:  xn = rmsnorm(x) * attn_norm;  p = xn @ wqkv^T, rows group by group:
              [q of the group's h heads (h*D), k_cmp, v_cmp, k_slc, v_slc, k_win, v_win (D
              each), gate logits of its h heads (3h: head-major, branch order cmp, slc, win)]
              o = NSA core (tests/nsa/oracle_nsa.py's dense reference)
              attention = "dense": wqkv rows per group [q (h*D), k (D), v (D)], no compression
              parameters, o = causal attention with RoPE (tests/nsa/oracle_dense.py)
              h = x + o @ wo^T;  hn = rmsnorm(h) * mlp_norm;  u = hn @ [w_gate; w_up]^T = [gate | up]
              x' = h + (silu(gate) * up) @ w_out^T
  xf = rmsnorm(x_L) * final_norm;  loss = mean cross entropy of xf @ E^T (E: the embedding
  when tied, else lm_head)

loads the engine's parameters into it, and requires the loss and every parameter gradient
within 1e-9 relative (max |ours - torch| / max |torch| per tensor; also evaluate()'s loss and
last_logits() against the torch logits of each sequence's last position), and the reference to be
non-degenerate (every gradient non-zero, every NSA branch non-zero, the top-n choice not
always the smallest blocks where it has a choice).

Run: /usr/bin/python3 oracle_model.py --nsatron PATH --driver PATH/model_oracle_driver [--seed S]
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as Fn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nsa"))
from oracle_nsa import nsa_reference  # noqa: E402  (the NSA core oracle, not edited here)
from oracle_dense import dense_reference  # noqa: E402  (the dense attention oracle)

RTOL = 1e-9

BASE = dict(V=11, C=8, L=2, H=4, G=2, D=4, F=12, cmp_block=4, cmp_stride=2, sel_block=4,
            sel_count=3, window=5, rope_theta=10000.0, norm_eps=1e-5, init_std=0.02, tie=1,
            B=2, T=13, random_sd=0.4, head_chunk=1024, policy="none", attention="nsa")

# name: overrides of BASE
CASES = {
    "tiny_tied": {},
    "tiny_untied_chunked_head": dict(tie=0, head_chunk=5),
    "one_group": dict(G=1, L=3),
    "one_head_per_group": dict(H=3, G=3, D=6, tie=0),
    "selection_choice_selective": dict(sel_count=4, T=21, B=3, policy="selective", rope_theta=500.0),
    "larger_own_init_full": dict(V=64, C=32, L=3, H=4, G=2, D=8, F=48, cmp_block=8, cmp_stride=4,
                                 sel_block=16, sel_count=4, window=24, B=2, T=100, random_sd=0.0,
                                 init_std=0.2, policy="full", head_chunk=64),
    "larger_random_untied": dict(V=64, C=32, L=2, H=6, G=2, D=8, F=40, cmp_block=8, cmp_stride=4,
                                 sel_block=16, sel_count=5, window=20, B=1, T=120, random_sd=0.3,
                                 tie=0),
    "dense_tiny_tied": dict(attention="dense"),
    "dense_one_group_untied_chunked_selective": dict(attention="dense", G=1, L=3, tie=0, head_chunk=5,
                                                     policy="selective", rope_theta=500.0),
    "dense_one_head_per_group_one_token": dict(attention="dense", H=3, G=3, D=6, B=3, T=1),
    "dense_larger_own_init_full": dict(attention="dense", V=64, C=32, L=3, H=6, G=2, D=8, F=48, B=2,
                                       T=100, random_sd=0.0, init_std=0.2, policy="full", head_chunk=64),
}


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def torch_model(P, tokens, targets, c, record):
    """P: dict name -> leaf tensor. Returns the mean loss; appends per-layer NSA info to record."""
    B, T = tokens.shape
    N = B * T
    C, H, G, D, F, L = c["C"], c["H"], c["G"], c["D"], c["F"], c["L"]
    h = H // G
    eps = c["norm_eps"]
    dense = c["attention"] == "dense"
    widths = [h * D, D, D] if dense else [h * D, D, D, D, D, D, D, 3 * h]
    x = P["model/embedding"][torch.from_numpy(tokens.reshape(-1).astype(np.int64))]   # [N, C]
    for layer in range(L):
        pre = f"model/layers.{layer}/"
        xn = rmsnorm(x, P[pre + "attn_norm"], eps)
        p = (xn @ P[pre + "attn/wqkv"].T).reshape(B, T, G, sum(widths))
        if dense:
            q, k, v = torch.split(p, widths, dim=-1)
            o, _ = dense_reference(q.reshape(B, T, G, h, D).reshape(B, T, H, D), k, v, c["rope_theta"])
        else:
            o = nsa_layer(p, widths, P, pre, c, B, T, H, G, h, D, record)
        hres = x + o.reshape(N, H * D) @ P[pre + "attn/wo"].T
        hn = rmsnorm(hres, P[pre + "mlp_norm"], eps)
        u = hn @ torch.cat([P[pre + "mlp/w_gate"], P[pre + "mlp/w_up"]]).T
        x = hres + (Fn.silu(u[:, :F]) * u[:, F:]) @ P[pre + "mlp/w_out"].T
    xf = rmsnorm(x, P["model/final_norm"], eps)
    head = P["model/embedding"] if c["tie"] else P["model/lm_head"]
    logits = xf @ head.T
    loss = Fn.cross_entropy(logits, torch.from_numpy(targets.reshape(-1).astype(np.int64)), reduction="mean")
    return loss, logits.detach().reshape(B, T, -1)[:, -1].numpy()


def nsa_layer(p, widths, P, pre, c, B, T, H, G, h, D, record):
    """The NSA core of one layer on its split projection p; appends the selection and the
    branch maxima to record."""
    q, kc, vc, ks, vs, kw, vw, gate = torch.split(p, widths, dim=-1)
    core_in = {
        "q": q.reshape(B, T, G, h, D).reshape(B, T, H, D),        # head a = g*h + i
        "k_cmp": kc, "v_cmp": vc, "k_slc": ks, "v_slc": vs, "k_win": kw, "v_win": vw,
        "gate": gate.reshape(B, T, G, h, 3).reshape(B, T, H, 3),
        "cmp_wk": P[pre + "attn/cmp_wk"], "cmp_wv": P[pre + "attn/cmp_wv"],
        "cmp_pk": P[pre + "attn/cmp_pk"], "cmp_pv": P[pre + "attn/cmp_pv"],
    }
    o, sel, branches = nsa_reference(core_in, c["cmp_block"], c["cmp_stride"], c["sel_block"],
                                     c["sel_count"], c["window"], c["rope_theta"])
    record.append((sel, [float(b.detach().abs().max()) for b in branches]))
    return o


def rel_err(a, b):
    ref = float(np.max(np.abs(b))) if b.size else 0.0
    err = float(np.max(np.abs(a - b))) if b.size else 0.0
    if ref == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / ref


def check_case(name, over, seed, driver, tmp, failures):
    c = dict(BASE, **over)
    out = os.path.join(tmp, name + ".h5")
    args = [driver, out, f"seed={seed}"] + [f"{k}={v}" for k, v in c.items()]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{name}: driver exited {r.returncode}: {r.stderr.strip()}")
        return
    with h5py.File(out, "r") as f:
        names = f.attrs["names"]
        names = (names.decode() if isinstance(names, bytes) else str(names)).split()
        W = {n: f["weights/" + n][...] for n in names}
        Gc = {n: f["grads/" + n][...] for n in names}
        tokens, targets = f["tokens"][...], f["targets"][...]
        loss_c, loss_eval = float(f.attrs["loss"]), float(f.attrs["loss_eval"])
        last_c = f["last_logits"][...]

    expected = {"model/embedding", "model/final_norm"} | ({"model/lm_head"} if not c["tie"] else set())
    for layer in range(c["L"]):
        expected |= {f"model/layers.{layer}/{p}" for p in
                     ("attn_norm", "attn/wqkv", "attn/wo", "mlp_norm", "mlp/w_gate", "mlp/w_up", "mlp/w_out")}
        if c["attention"] == "nsa":
            expected |= {f"model/layers.{layer}/attn/{p}" for p in ("cmp_wk", "cmp_wv", "cmp_pk", "cmp_pv")}
    if set(names) != expected:
        failures.append(f"{name}: parameters {sorted(set(names) ^ expected)} unexpected or missing")
        return

    P = {n: torch.tensor(W[n], dtype=torch.float64, requires_grad=True) for n in names}
    record = []
    loss_t, last_t = torch_model(P, tokens, targets, c, record)
    loss_t.backward()
    loss_t = float(loss_t.detach())

    errs = {"loss": abs(loss_c - loss_t) / abs(loss_t), "loss_eval": abs(loss_eval - loss_t) / abs(loss_t),
            "last_logits": rel_err(last_c, last_t) if last_c.shape == last_t.shape else math.inf}
    for n in names:
        g = P[n].grad.numpy() if P[n].grad is not None else np.zeros_like(W[n])
        if Gc[n].shape != g.shape:
            failures.append(f"{name}: grad {n} shape {Gc[n].shape} vs {g.shape}")
            continue
        errs[n] = rel_err(Gc[n], g)
        if float(np.max(np.abs(g))) < 1e-8:
            failures.append(f"{name}: reference gradient of {n} is (near) zero: degenerate case")

    # The reference must exercise every branch and, where it can, a real top-n choice.
    T, ls, n_sel = c["T"], c["sel_block"], c["sel_count"]
    for layer, (sel, bmax) in enumerate(record):
        for bname, m in zip(("o_cmp", "o_slc", "o_win"), bmax):
            if m == 0.0:
                failures.append(f"{name}: layer {layer} branch {bname} identically zero")
    NB = (T + ls - 1) // ls
    if NB > n_sel and record:  # (dense attention records nothing)
        has_choice = [(t // ls) >= n_sel for t in range(T)]
        if any(has_choice) and all(np.all(sel[:, has_choice][..., 1] == 1) for sel, _ in record):
            failures.append(f"{name}: the selection always takes the smallest blocks")

    worst = max(errs, key=errs.get)
    print(f"  {name:28s} seed={seed} " + " ".join(f"{k}={c[k]}" for k in
          ("V", "C", "L", "H", "G", "D", "F", "B", "T", "tie", "random_sd", "policy", "attention")) +
          f"\n  {'':28s} loss {loss_t:.12f}; worst {worst} {errs[worst]:.2e}")
    for k, e in errs.items():
        if not e <= RTOL:
            failures.append(f"{name}: {k} relative error {e:.3e} > {RTOL:g}")


def self_test_checker():
    """The comparison must notice a 1e-8 relative change in one element."""
    a = np.random.default_rng(0).standard_normal((7, 5))
    b = a.copy()
    b[3, 2] += 1e-8 * np.max(np.abs(a))
    assert rel_err(a, a) == 0.0 and not rel_err(b, a) <= RTOL


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nsatron", required=False, help="path to the nsatron executable (unused)")
    ap.add_argument("--driver", required=True, help="path to model_oracle_driver")
    ap.add_argument("--seed", type=int, default=None, help="reproduce a run")
    ap.add_argument("--only", default=None, help="run one case by name")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"oracle_model: seed {seed} (rerun with --seed {seed}); torch {torch.__version__}")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    self_test_checker()
    rng = np.random.default_rng(seed)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, over in CASES.items():
            case_seed = int(rng.integers(0, 2**62))
            if args.only and name != args.only:
                continue
            check_case(name, over, case_seed, args.driver, tmp, failures)
    if failures:
        print(f"FAILED (seed {seed}):")
        for m in failures:
            print("  " + m)
        return 1
    print("oracle_model: the whole model agrees with torch autograd")
    return 0


if __name__ == "__main__":
    sys.exit(main())
