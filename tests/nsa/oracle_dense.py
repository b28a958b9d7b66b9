#!/usr/bin/python3
"""PyTorch autograd oracle for dense causal attention (nsa/dense.h, model.attention = "dense").

The reference is written from the definition, as a plain float64 [T, T] masked softmax with
torch autograd (the rotate-half RoPE and the masked softmax are oracle_nsa.py's): for query
t, head a of group a // h, o = softmax_{s <= t}(scale RoPE(q_t, t) . RoPE(k_s, s)) v,
lse = the log-sum-exp of those scores; gradients of sum(out * d_out).

For each shape (the awkward ones: T = 1, odd T, one head per group, one group, many heads per
group, D = 2) it draws FRESH random inputs (the seed is printed; --seed reproduces a run),
runs dense_oracle_driver (the engine's fp64 CPU core) on them and requires out, lse, dq, dk
and dv within 1e-10 relative (max abs error / max abs value), and the reference to be
non-degenerate (every gradient non-zero where the shape allows).

Run: /usr/bin/python3 oracle_dense.py --dense_oracle_driver PATH [--seed S] [--only NAME]
"""
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_nsa import masked_attention, rel_err, rope, run_oracle  # noqa: E402

RTOL = 1e-10

# name: (B, T, H, G, D)
SHAPES = {
    "T_1":                 (2, 1, 4, 2, 4),
    "T_2":                 (1, 2, 2, 1, 4),
    "odd_T":               (2, 37, 4, 2, 8),
    "one_head_per_group":  (1, 29, 3, 3, 6),
    "one_group":           (2, 23, 4, 1, 4),
    "8_heads_per_group":   (1, 33, 16, 2, 8),
    "D_2":                 (1, 17, 2, 2, 2),
    "longer":              (1, 301, 4, 2, 16),
}


def dense_reference(q, k, v, theta):
    """q [B,T,H,D], k/v [B,T,G,D] -> out [B,T,H,D], lse [B,T,H]."""
    B, T, H, D = q.shape
    G = k.shape[2]
    pos = torch.arange(T)
    qr = rope(q, pos[None, :, None], theta)
    kr = rope(k, pos[None, :, None], theta)
    per_head = lambda x: x.repeat_interleave(H // G, dim=2)  # head a reads group a // h
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
    out, _ = masked_attention(qr, per_head(kr), per_head(v), causal, 1.0 / math.sqrt(D))
    scores = torch.einsum("bthd,bshd->bhts", qr, per_head(kr)) / math.sqrt(D)
    lse = torch.logsumexp(scores.masked_fill(~causal, -math.inf), dim=-1).permute(0, 2, 1)
    return out, lse


def check_shape(name, dims, rng, driver, tmp, failures):
    B, T, H, G, D = dims
    theta = float(rng.choice([10000.0, 500.0]))
    x_np = {"q": rng.standard_normal((B, T, H, D)), "k": rng.standard_normal((B, T, G, D)),
            "v": rng.standard_normal((B, T, G, D))}
    d_out_np = rng.standard_normal((B, T, H, D))
    x = {n: torch.tensor(a, requires_grad=True) for n, a in x_np.items()}
    out, lse = dense_reference(x["q"], x["k"], x["v"], theta)
    (out * torch.tensor(d_out_np)).sum().backward()
    want = {"out": out.detach().numpy(), "lse": lse.detach().numpy(),
            "dq": x["q"].grad.numpy(), "dk": x["k"].grad.numpy(), "dv": x["v"].grad.numpy()}
    # T = 1: a softmax over one key does not depend on it (dq = dk = 0 exactly).
    for n in ("dq", "dk", "dv"):
        if not (T == 1 and n in ("dq", "dk")) and float(np.abs(want[n]).max()) < 1e-6:
            failures.append(f"{name}: reference gradient {n} is (near) zero")

    case = os.path.join(tmp, name)
    os.makedirs(case)
    for n, a in list(x_np.items()) + [("d_out", d_out_np)]:
        np.ascontiguousarray(a, dtype="<f8").tofile(os.path.join(case, n + ".bin"))
    r = subprocess.run([driver, case, str(B), str(T), str(H), str(G), str(D), repr(theta)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{name}: driver exited {r.returncode}: {r.stderr.strip()}")
        return
    errs = {}
    for n, ref in want.items():
        got = np.fromfile(os.path.join(case, n + ".bin"), dtype="<f8")
        errs[n] = rel_err(got.reshape(ref.shape), ref) if got.size == ref.size else math.inf
    worst = max(errs, key=errs.get)
    print(f"  {name:20s} B={B} T={T} H={H} G={G} D={D} theta={theta:g}: worst {worst} {errs[worst]:.2e}")
    for n, e in errs.items():
        if not e <= RTOL:
            failures.append(f"{name}: {n} relative error {e:.3e} > {RTOL:g}")


def self_test():
    """The comparison notices a 1e-9 relative change, and the reference is causal softmax
    attention: with T = 1 the output is the value itself."""
    a = np.random.default_rng(0).standard_normal(100)
    b = a.copy()
    b[17] += 1e-9 * np.max(np.abs(a))
    assert rel_err(a, a) == 0.0 and not rel_err(b, a) <= RTOL
    q, k, v = (torch.randn(1, 1, 2, 4, dtype=torch.float64) for _ in range(3))
    out, _ = dense_reference(q, k[:, :, :1], v[:, :, :1], 10000.0)
    assert torch.equal(out, v[:, :, :1].expand(1, 1, 2, 4))


if __name__ == "__main__":
    sys.exit(run_oracle("oracle_dense", __doc__.split("\n")[0], SHAPES, check_shape, self_test,
                        program="dense_oracle_driver"))
