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

Usage: /usr/bin/python3 bench/bf16_error_model.py [--seeds N]   (Debian's python3-torch)
"""
import argparse
import math

import torch

torch.set_default_dtype(torch.float64)


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float64)


def rope(x, theta):  # x [T, H, D], the rotation of the NSA spec (halves)
    T, _, D = x.shape
    half = D // 2
    inv = theta ** (-torch.arange(half) * 2.0 / D)
    ang = torch.arange(T)[:, None] * inv[None, :]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def attention(q, k, v, scale):  # one key head per query head; returns out, p [H, T, T]
    T = q.shape[0]
    s = torch.einsum("thd,uhd->htu", q, k) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1)[None], -math.inf)
    p = torch.softmax(s, -1)
    return torch.einsum("htu,uhd->thd", p, v), p


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=60)
    args = ap.parse_args()
    shapes = [(2, 2, 16, 1e4), (17, 2, 2, 500.0), (37, 4, 32, 500.0), (33, 16, 64, 1e4)]  # T, H, D, theta
    print("roundings       shape          median    p90      max   above 1e-2")
    for round_qk, round_dq in [(True, True), (True, False), (False, True)]:
        name = "+".join(n for n, on in [("qk", round_qk), ("dq", round_dq)] if on)
        for T, H, D, theta in shapes:
            e = sorted(dq_error(T, H, D, theta, s, round_qk, round_dq) for s in range(args.seeds))
            n = len(e)
            print(f"{name:8s} T={T:3d} H={H:2d} D={D:3d}  {e[n // 2]:.2e} {e[(9 * n) // 10]:.2e} {e[-1]:.2e} "
                  f"{sum(x > 1e-2 for x in e):4d}/{n}")


if __name__ == "__main__":
    main()
