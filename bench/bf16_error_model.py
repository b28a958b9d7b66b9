#!/usr/bin/python3
"""Error model of the bf16 dense attention backward (nsa/cuda/dense.h), in float64.

Emulates the roundings of the tensor-core kernels one at a time and measures dq against the
exact gradient as test_dense_cuda does (max |error| / max |reference|, bound 1e-2), over many
seeds, for the test's small shapes. Used to find why DenseCuda.Bf16MatchesCpu failed on some
seeds (docs/performance.md, 2026-11-27, second session).

The roundings:
  qk     the rotated q and k rounded to bf16 before the scores (the padded tensor-core copies)
  dq     dq stored as bf16
The reference takes the delta = do . out of the output the GPU wrote (bf16), as the test does.

With --window-keys: the same for the NSA window branch's key side (tc::key_kernel, its dK and
dV; one head per group, gated), at the parity case "1 head/group, D=48" of test_nsa_cuda
(T = 700, 3 heads, w = 128), with dS rounded to bf16 once (key_ds_parts 1: padded D = 128 now,
up to 64 before 2026-11-28) or kept as hi + lo (2: padded D <= 64 now), measured as the test
does (max |error| / max |reference| per gradient).
The roundings there:
  qk     the rotated q and k rounded to bf16 (the padded copies)
  pv     the forward's P rounded to bf16 in O += P V (the saved o_win, whence delta)
  ds     dS rounded to bf16 once in dK += dS^T Q (off: hi + lo, ~16 bits)
  gp     g p rounded to bf16 in dV += (g p)^T dO
  out    dK and dV stored as bf16

With --dense-ds: dense attention's dq from the row side with dS rounded to bf16 once in
dq += dS K (row_ds_parts 1) or kept as hi + lo (2), with every other rounding of the kernels
(q and k, the forward's P in P V, the output, dq stored), at the test's shapes T = 300 D = 64,
T = 1000 D = 128 and T = 37 D = 32 (docs/performance.md, 2026-11-29, twenty-third session).

Usage: /usr/bin/python3 bench/bf16_error_model.py [--seeds N] [--window-keys | --dense-ds]   (Debian's python3-torch)
"""
import argparse
import math

import torch

torch.set_default_dtype(torch.float64)


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float64)


def rope(x, theta, inverse=False):  # x [T, H, D], the rotation of the NSA spec (halves)
    T, _, D = x.shape
    half = D // 2
    inv = theta ** (-torch.arange(half) * 2.0 / D)
    ang = torch.arange(T)[:, None] * inv[None, :]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    if inverse:  # the transpose of the rotation
        s = -s
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def attention(q, k, v, scale):  # one key head per query head; returns out, p [H, T, T]
    T = q.shape[0]
    s = torch.einsum("thd,uhd->htu", q, k) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1)[None], -math.inf)
    p = torch.softmax(s, -1)
    return torch.einsum("htu,uhd->thd", p, v), p


def p_rounded_out(p, v):
    """The forward's P V with P rounded to bf16 relative to the row max, as the online softmax
    rounds it: p [H, T, U] normalised (p / max p is exp(s - max s); the row sum is 1 / max p)."""
    m = p.amax(-1, keepdim=True)
    return torch.einsum("htu,uhd->thd", bf16(p / m), v) * m.permute(1, 0, 2)


def dq_error(T, H, D, theta, seed, round_qk, round_dq):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = [bf16(torch.randn(T, H, D, generator=g)) for _ in range(4)]
    scale = 1 / math.sqrt(D)
    qr, kr = rope(q, theta), rope(k, theta)
    qs, ks = (bf16(qr), bf16(kr)) if round_qk else (qr, kr)
    out_gpu, p_gpu = attention(qs, ks, v, scale)
    _, p_ref = attention(qr, kr, v, scale)
    dP = torch.einsum("thd,uhd->htu", do, v)
    delta = (do * bf16(out_gpu)).sum(-1).permute(1, 0)[..., None]  # from the bf16 output
    ref = torch.einsum("htu,uhd->thd", p_ref * (dP - delta), kr) * scale
    gpu = torch.einsum("htu,uhd->thd", p_gpu * (dP - delta), ks) * scale
    if round_dq:
        gpu = bf16(gpu)
    return ((gpu - ref).abs().max() / ref.abs().max()).item()


def window_key_errors(T, H, D, w, theta, seed, ds_parts):
    """(grad_k_win, grad_v_win) errors of the emulated key side, one head per group."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = [bf16(torch.randn(T, H, D, generator=g)) for _ in range(4)]
    gate = torch.sigmoid(bf16(torch.randn(T, H, generator=g)))[..., None]  # [T, H, 1]
    scale = 1 / math.sqrt(D)
    t = torch.arange(T)
    seen = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - w)  # [t, u]: key u seen by t
    qr, kr = rope(q, theta), rope(k, theta)
    qs, ks = bf16(qr), bf16(kr)

    def probs(qx, kx):
        sc = torch.einsum("thd,uhd->htu", qx, kx) * scale
        return torch.softmax(sc.masked_fill(~seen[None], -math.inf), -1)

    p_ref, p_gpu = probs(qr, kr), probs(qs, ks)
    o_ref = torch.einsum("htu,uhd->thd", p_ref, v)
    o_gpu = p_rounded_out(p_gpu, v)
    gh = gate.permute(1, 0, 2)  # [H, T, 1]
    dP = torch.einsum("thd,uhd->htu", do, v)

    def grads(p, o, qx, ds_round, gp_round):
        delta = (gate * (do * o).sum(-1, keepdim=True)).permute(1, 0, 2)  # g (do . o), [H, T, 1]
        dS = p * (gh * dP - delta)
        dS = bf16(dS) if ds_round else dS
        dk = rope(torch.einsum("htu,thd->uhd", dS, qx) * scale, theta, inverse=True)
        gp = bf16(gh * p) if gp_round else gh * p
        dv = torch.einsum("htu,thd->uhd", gp, do)
        return dk, dv

    dk_ref, dv_ref = grads(p_ref, o_ref, qr, False, False)
    dk_gpu, dv_gpu = grads(p_gpu, o_gpu, qs, ds_parts == 1, True)
    err = lambda a, b: ((bf16(a) - b).abs().max() / b.abs().max()).item()
    return err(dk_gpu, dk_ref), err(dv_gpu, dv_ref)


def dense_dq_errors(T, H, D, theta, seed, ds_parts):
    """dq of the emulated row side (dense attention, bf16), dS rounded to bf16 once in dq += dS K
    (row_ds_parts 1) or kept as hi + lo (2), measured as test_dense_cuda does: against the exact
    gradient whose delta is taken from the GPU's output, as the test's reference."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = [bf16(torch.randn(T, H, D, generator=g)) for _ in range(4)]
    scale = 1 / math.sqrt(D)
    qr, kr = rope(q, theta), rope(k, theta)
    qs, ks = bf16(qr), bf16(kr)
    p_ref, p_gpu = attention(qr, kr, v, scale)[1], attention(qs, ks, v, scale)[1]
    o_gpu = bf16(p_rounded_out(p_gpu, v))
    delta = (do * o_gpu).sum(-1).permute(1, 0)[..., None]  # [H, T, 1], both from the GPU's output
    dP = torch.einsum("thd,uhd->htu", do, v)

    def dq(p, kx, ds_round):
        dS = p * (dP - delta)
        dS = bf16(dS) if ds_round else dS
        return rope(torch.einsum("htu,uhd->thd", dS, kx) * scale, theta, inverse=True)

    ref = dq(p_ref, kr, False)
    gpu = bf16(dq(p_gpu, ks, ds_parts == 1))
    return ((gpu - ref).abs().max() / ref.abs().max()).item()


def spread(errors):
    """The median, 90th percentile, max and count above the tests' 1e-2 bound of relative errors,
    as the tables print them."""
    x = sorted(errors)
    n = len(x)
    return f"{x[n // 2]:.2e} {x[(9 * n) // 10]:.2e} {x[-1]:.2e} {sum(v > 1e-2 for v in x):4d}/{n}"


def dense_dq_main(seeds):
    print("dS parts  shape                 median    p90      max   above 1e-2")
    for T, H, D, theta in [(300, 4, 64, 1e4), (1000, 8, 128, 1e4), (37, 4, 32, 500.0)]:
        for parts in (1, 2):
            errors = [dense_dq_errors(T, H, D, theta, s, parts) for s in range(seeds)]
            print(f"{parts:8d}  T={T:4d} H={H:2d} D={D:3d}  {spread(errors)}")


def window_keys_main(seeds):
    T, H, D, w, theta = 700, 3, 48, 128, 1e4  # test_nsa_cuda's "1 head/group, D=48"
    print("dS parts  gradient   median    p90      max   above 1e-2")
    for parts in (1, 2):
        e = [window_key_errors(T, H, D, w, theta, s, parts) for s in range(seeds)]
        for i, name in enumerate(("grad_k_win", "grad_v_win")):
            print(f"{parts:8d}  {name}  {spread(v[i] for v in e)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--window-keys", action="store_true")
    ap.add_argument("--dense-ds", action="store_true")
    args = ap.parse_args()
    if args.dense_ds:
        return dense_dq_main(args.seeds)
    if args.window_keys:
        return window_keys_main(args.seeds)
    shapes = [(2, 2, 16, 1e4), (17, 2, 2, 500.0), (37, 4, 32, 500.0), (33, 16, 64, 1e4)]  # T, H, D, theta
    print("roundings       shape          median    p90      max   above 1e-2")
    for round_qk, round_dq in [(True, True), (True, False), (False, True)]:
        name = "+".join(n for n, on in [("qk", round_qk), ("dq", round_dq)] if on)
        for T, H, D, theta in shapes:
            errors = [dq_error(T, H, D, theta, s, round_qk, round_dq) for s in range(args.seeds)]
            print(f"{name:8s} T={T:3d} H={H:2d} D={D:3d}  {spread(errors)}")


if __name__ == "__main__":
    main()
