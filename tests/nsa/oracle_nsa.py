#!/usr/bin/python3
"""PyTorch autograd oracle for the NSA attention core (NSA_SPEC.md).

A plain, dense, masked float64 implementation of the NSA function, written from the spec
(and on purpose nothing like the engine's sparse loops): full [T, T] score matrices with
boolean masks, an explicit overlap matrix, and the top-n rule as a Python sort. Autograd
gives the gradients of sum(out * d_out).

For each shape (the awkward ones of issue 3 and the paper shape at moderate T) it draws FRESH
random inputs (the seed is printed; --seed reproduces a run), writes IN.h5, runs
`nsatron nsa-parity --in IN.h5 --out OUT.h5` and requires:
  - sel_blocks identical,
  - out and all twelve gradients within 1e-10 relative (max abs error / max abs value),
  - the reference itself non-degenerate (every branch and gradient that can be non-zero is,
    and the top-n choice is not always the smallest indices where it has a choice); a draw
    whose reference is degenerate is replaced (at most MAX_DRAWS times, see there).
Run: /usr/bin/python3 oracle_nsa.py --nsatron build/launch/nsatron [--seed S] [--only NAME]
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

NAMES = ["q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win",
         "gate", "cmp_wk", "cmp_wv", "cmp_pk", "cmp_pv"]
RTOL = 1e-10

# name: (B, T, H, G, D, cmp_block l, cmp_stride d, sel_block l', sel_count n, window w)
SHAPES = {
    "T_lt_l":               (2, 20, 4, 2, 8, 32, 16, 64, 16, 512),
    "T_not_multiple":       (1, 203, 4, 2, 8, 8, 4, 16, 5, 24),
    "l_eq_d_eq_lsel":       (2, 97, 4, 2, 8, 8, 8, 8, 4, 16),
    "n_gt_blocks":          (1, 150, 4, 2, 8, 8, 4, 16, 16, 32),
    "w_1":                  (1, 130, 6, 3, 8, 8, 4, 16, 4, 1),
    "w_gt_T":               (1, 130, 4, 2, 8, 8, 4, 16, 4, 500),
    "one_head_per_group":   (2, 111, 3, 3, 8, 8, 4, 16, 4, 20),
    "one_group":            (1, 120, 4, 1, 8, 8, 4, 16, 5, 20),
    "8_heads_per_group":    (1, 100, 16, 2, 8, 8, 4, 16, 4, 20),
    "12_heads_one_group":   (1, 90, 12, 1, 6, 8, 4, 16, 4, 9),
    "paper_32_16_64_16_512": (1, 1500, 4, 2, 32, 32, 16, 64, 16, 512),
}


def rope(x, pos, theta):
    """Rotate-half RoPE of x [..., D] at positions pos (broadcast against x[..., 0])."""
    D = x.shape[-1]
    half = D // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    angle = pos.to(torch.float64)[..., None] * freq
    c, s = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def masked_attention(q, k, v, allowed, scale):
    """q [B,T,H,D], k/v [B,S,H,D], allowed [B|1, H|1, T, S] -> out [B,T,H,D], p [B,H,T,S].
    Rows with no allowed key give out = 0."""
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    scores = scores.masked_fill(~allowed, -1e300)  # exp(-1e300 - max) == 0 exactly
    p = torch.softmax(scores, dim=-1) * allowed
    return torch.einsum("bhts,bshd->bthd", p, v), p


def overlap_matrix(N, NB, l, d, ls):
    """ov[i, j] = (tokens shared by compressed block i and selection block j) / d."""
    ov = torch.zeros(N, NB, dtype=torch.float64)
    for i in range(N):
        for j in range(NB):
            lo, hi = max(i * d, j * ls), min(i * d + l - 1, (j + 1) * ls - 1)
            ov[i, j] = max(0, hi - lo + 1) / d
    return ov


def choose_blocks(S, T, n, ls):
    """S [B,G,T,NB] numpy -> sel [B,G,T,n] int32: forced 0, b_t, b_t-1; the rest by score,
    ties to the smaller index; ascending; -1 padded."""
    B, G = S.shape[0], S.shape[1]
    sel = np.full((B, G, T, n), -1, dtype=np.int32)
    for b in range(B):
        for g in range(G):
            for t in range(T):
                bt = t // ls
                forced = {0, bt} | ({bt - 1} if bt >= 1 else set())
                rest = sorted((j for j in range(bt + 1) if j not in forced),
                              key=lambda j: (-S[b, g, t, j], j))
                chosen = sorted(forced | set(rest[:n - len(forced)]))
                sel[b, g, t, :len(chosen)] = chosen
    return sel


def nsa_reference(x, l, d, ls, n, w, theta):
    """x: dict of float64 leaf tensors. Returns out, sel [B,T,G,n], branch outputs."""
    q = x["q"]
    B, T, H, D = q.shape
    G = x["k_cmp"].shape[2]
    h = H // G
    scale = 1.0 / math.sqrt(D)
    pos = torch.arange(T)
    qr = rope(q, pos[:, None], theta)

    def per_head(t):  # [B, S, G, D] -> [B, S, H, D]; head a reads group a // h
        return t.repeat_interleave(h, dim=2)

    # Branch 1: compression.
    N = (T - l) // d + 1 if T >= l else 0
    if N > 0:
        tok = torch.arange(N)[:, None] * d + torch.arange(l)[None, :]  # [N, l]
        end = torch.arange(N) * d + l - 1

        def compress(xv, pe, W):
            X = xv[:, tok] + pe.permute(1, 0, 2)                  # [B, N, l, G, D]
            X = X.permute(0, 1, 3, 2, 4).reshape(B, N, G, l * D)  # token-major flatten
            return torch.einsum("bngf,gfe->bnge", X, W)

        Kc = rope(compress(x["k_cmp"], x["cmp_pk"], x["cmp_wk"]), end[:, None], theta)
        Vc = compress(x["v_cmp"], x["cmp_pv"], x["cmp_wv"])
        visible = end[None, :] <= pos[:, None]                    # [T, N]
        o_cmp, p_cmp = masked_attention(qr, per_head(Kc), per_head(Vc), visible[None, None], scale)
    else:
        o_cmp = torch.zeros_like(q)
        p_cmp = torch.zeros(B, H, T, 0, dtype=torch.float64)

    # Selection (no gradient through the choice).
    NB = (T + ls - 1) // ls
    s_head = torch.einsum("bhtn,nj->bhtj", p_cmp.detach(), overlap_matrix(N, NB, l, d, ls))
    S = s_head.reshape(B, G, h, T, NB).sum(dim=2)                  # sum over the group's heads
    sel = choose_blocks(S.numpy(), T, n, ls)                       # [B, G, T, n]
    block_on = torch.zeros(B, G, T, NB + 1, dtype=torch.bool)      # column NB absorbs the -1s
    idx = torch.from_numpy(sel.astype(np.int64))
    block_on.scatter_(3, torch.where(idx < 0, NB, idx), True)
    block_on = block_on[..., :NB]
    causal = pos[None, :] <= pos[:, None]                          # [T, S]: s <= t
    allowed_slc = block_on[..., pos // ls] & causal                # [B, G, T, S]
    o_slc, _ = masked_attention(qr, per_head(rope(x["k_slc"], pos[:, None], theta)),
                                per_head(x["v_slc"]), allowed_slc.repeat_interleave(h, dim=1), scale)

    # Branch 3: sliding window.
    allowed_win = causal & (pos[None, :] > pos[:, None] - w)
    o_win, _ = masked_attention(qr, per_head(rope(x["k_win"], pos[:, None], theta)),
                                per_head(x["v_win"]), allowed_win[None, None], scale)

    g = torch.sigmoid(x["gate"])
    out = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win
    return out, sel.transpose(0, 2, 1, 3).copy(), (o_cmp, o_slc, o_win)


def random_inputs(rng, B, T, H, G, D, l):
    shapes = {"q": (B, T, H, D), "gate": (B, T, H, 3),
              "cmp_wk": (G, l * D, D), "cmp_wv": (G, l * D, D),
              "cmp_pk": (G, l, D), "cmp_pv": (G, l, D)}
    x = {}
    for name in NAMES:
        shape = shapes.get(name, (B, T, G, D))
        sd = 1.0 / math.sqrt(l * D) if name in ("cmp_wk", "cmp_wv") else 1.0
        x[name] = rng.standard_normal(shape) * sd
    return x, rng.standard_normal((B, T, H, D))


def rel_err(a, b):
    ref = np.max(np.abs(b)) if b.size else 0.0
    err = np.max(np.abs(a - b)) if b.size else 0.0
    if ref == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / ref


def degeneracy(name, dims, out_sel_branches, grad):
    """Why the reference of this draw cannot test the engine (empty list: it can)."""
    B, T, H, G, D, l, d, ls, n, w = dims
    sel, branches = out_sel_branches
    why = []
    N = (T - l) // d + 1 if T >= l else 0
    zero_ok = set()
    if N == 0:
        zero_ok |= {"k_cmp", "v_cmp", "cmp_wk", "cmp_wv", "cmp_pk", "cmp_pv"}
    if w == 1:
        zero_ok.add("k_win")  # a softmax over one key does not depend on it
    for bname, o in zip(("o_cmp", "o_slc", "o_win"), branches):
        if not (bname == "o_cmp" and N == 0) and float(o.abs().max()) == 0.0:
            why.append(f"{name}: reference branch {bname} is identically zero")
    for k in NAMES:
        if k not in zero_ok and float(np.abs(grad[k]).max()) < 1e-6:
            why.append(f"{name}: reference gradient of {k} is (near) zero")
    NB = (T + ls - 1) // ls
    if NB > n:  # rows with a real choice must not all pick the smallest indices
        has_choice = [(t // ls) >= n for t in range(T)]
        if any(has_choice):
            rows = sel[:, has_choice]
            if np.all(rows[..., 1] == 1):
                why.append(f"{name}: reference selection always takes the smallest blocks")
    return why


# A draw whose reference is degenerate is replaced by a fresh one, at most this many times. The
# small shapes have few rows with a choice (12_heads_one_group: 26 rows choosing one block of
# two or three), so a fair draw takes the smallest blocks in every such row about once in 150
# seeds (seed 1080 did); a reference that is degenerate by construction stays so in every draw
# and still fails.
MAX_DRAWS = 5


def check_shape(name, dims, rng, nsatron, tmp, failures):
    B, T, H, G, D, l, d, ls, n, w = dims
    for draw in range(MAX_DRAWS):
        theta = float(rng.choice([10000.0, 500.0]))
        x_np, d_out_np = random_inputs(rng, B, T, H, G, D, l)
        x = {k: torch.tensor(v, requires_grad=True) for k, v in x_np.items()}
        out, sel, branches = nsa_reference(x, l, d, ls, n, w, theta)
        (out * torch.tensor(d_out_np)).sum().backward()
        # Inputs the function does not use (the compression when T < l) have no .grad: zero.
        grad = {k: (x[k].grad if x[k].grad is not None else torch.zeros_like(x[k])).numpy()
                for k in NAMES}
        why = degeneracy(name, dims, (sel, branches), grad)
        if not why:
            break
        print(f"  {name}: degenerate draw {draw + 1} ({why[0].split(': ', 1)[1]}), drawing again")
    else:
        failures.extend(why)
        return

    inp, outp = os.path.join(tmp, f"{name}_in.h5"), os.path.join(tmp, f"{name}_out.h5")
    with h5py.File(inp, "w") as f:
        for k, v in x_np.items():
            f.create_dataset(k, data=v)
        f.create_dataset("d_out", data=d_out_np)
        for k, v in (("cmp_block", l), ("cmp_stride", d), ("sel_block", ls),
                     ("sel_count", n), ("window", w)):
            f.attrs[k] = np.int64(v)
        f.attrs["rope_theta"] = np.float64(theta)
    r = subprocess.run([nsatron, "nsa-parity", "--in", inp, "--out", outp],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{name}: nsa-parity exited {r.returncode}: {r.stderr.strip()}")
        return
    errs = {}
    with h5py.File(outp, "r") as f:
        got_sel = f["sel_blocks"][...]
        if got_sel.dtype != np.int32 or not np.array_equal(got_sel, sel):
            bad = np.argwhere(got_sel != sel) if got_sel.shape == sel.shape else []
            failures.append(f"{name}: sel_blocks differ (dtype {got_sel.dtype}, "
                            f"{len(bad)} entries, first at [b,t,g,k]={bad[0].tolist() if len(bad) else '?'})")
        errs["out"] = rel_err(f["out"][...], out.detach().numpy())
        for k in NAMES:
            errs["grad_" + k] = rel_err(f["grad_" + k][...], grad[k])
    worst = max(errs, key=errs.get)
    print(f"  {name:24s} B={B} T={T} H={H} G={G} D={D} l={l} d={d} l'={ls} n={n} w={w} "
          f"theta={theta:g}: worst {worst} {errs[worst]:.2e}")
    for k, e in errs.items():
        if not e <= RTOL:
            failures.append(f"{name}: {k} relative error {e:.3e} > {RTOL:g}")


def self_test_checker():
    """The comparison must notice a 1e-9 relative change."""
    a = np.random.default_rng(0).standard_normal(100)
    b = a.copy()
    b[17] += 1e-9 * np.max(np.abs(a))
    assert rel_err(a, a) == 0.0 and not rel_err(b, a) <= RTOL


def run_oracle(tool, description, shapes, check, self_test, program="nsatron"):
    """The command line of a core oracle: --<program> PATH (what runs the engine: the nsatron
    executable or a test driver), --seed S (default: fresh, printed), --only NAME. Runs
    self_test(), then check(name, dims, rng, path, tmp, failures) for each shape with one
    generator; returns the exit code."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--nsatron", required=program == "nsatron", help="path to the nsatron executable")
    if program != "nsatron":
        ap.add_argument("--" + program, required=True, help=f"path to {program}")
    ap.add_argument("--seed", type=int, default=None, help="reproduce a run")
    ap.add_argument("--only", default=None, help="run one shape by name")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"{tool}: seed {seed} (rerun with --seed {seed}); torch {torch.__version__}")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    self_test()
    rng = np.random.default_rng(seed)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in shapes.items():
            if args.only and name != args.only:
                continue
            check(name, dims, rng, getattr(args, program), tmp, failures)
    if failures:
        print(f"FAILED (seed {seed}):")
        for m in failures:
            print("  " + m)
        return 1
    print(f"{tool}: all shapes agree")
    return 0


if __name__ == "__main__":
    sys.exit(run_oracle("oracle_nsa", __doc__.split("\n")[0], SHAPES, check_shape, self_test_checker))
