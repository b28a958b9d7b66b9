#!/usr/bin/env python3
"""How much of the selection row kernels' work is waste, by heads per group: a count of products.

The selection row kernels (nsa/cuda/attention_tc.cuh, row_kernel with BR = kSlc) give a block
64 rows of one (batch, group), 64 / h positions x h heads, and run every 64-key tile of the
union of those positions' selected blocks against all 64 rows (the union loop); at h = 1 the
64 positions' random choices cover almost every visible block. This model draws the choices as
bench_nsa_gpu's random inputs make them (docs/nsa.md: independent inputs, so apart from the
forced blocks, 0, b_t and b_t - 1 (NSA_SPEC.md), the n - 3 others are in effect uniform among
the eligible ones), with l' = 64 (one block per tile), and counts per block, in 16-row x 64-key
products:
  union     every union tile x all 64 rows (what the kernels run now);
  gathered  every union tile x the rows that chose it, in whole 16-row groups (a kernel that
            gathers each tile's rows on chip: measured slower than the union at every h, its
            rows' state in shared memory leaving one block per SM: docs/performance.md,
            twenty-fifth session);
  exact     the selected pairs, 16 rows per 16-row product (the inverted loop's products; it
            then writes and merges per-slot partials).
Prints the ratios union / exact and gathered / exact per h.

  /usr/bin/python3 bench/selection_rows_model.py                 # T = 8192, h = 1, 2, 4, 8, 16
  /usr/bin/python3 bench/selection_rows_model.py --T 65536 --blocks 200
"""
import argparse
import math
import random


def choices(t, n, ls, rng):
    """The selected blocks of position t: the forced ones and uniform picks among the rest."""
    bt = t // ls
    chosen = {0, bt} | ({bt - 1} if bt >= 1 else set())
    rest = [j for j in range(bt + 1) if j not in chosen]
    k = min(n - len(chosen), len(rest))
    chosen |= set(rng.sample(rest, k)) if k > 0 else set()
    return chosen


def block_counts(t0, npos, h, n, ls, T, rng):
    """(union, gathered, exact) 16x64 products of the 64-row block whose first position is t0."""
    picks = [choices(t, n, ls, rng) for t in range(t0, min(T, t0 + npos))]
    union = set().union(*picks)
    rows_of = {j: sum(h for p in picks if j in p) for j in union}
    u = len(union) * 4  # 64 rows: four 16-row products per tile
    g = sum(math.ceil(r / 16) for r in rows_of.values())
    e = sum(len(p) * h for p in picks) / 16
    return u, g, e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--ls", type=int, default=64)
    ap.add_argument("--h", default="1,2,4,8,16")
    ap.add_argument("--blocks", type=int, default=0, help="row blocks sampled per h (0: all of one group)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print(f"T = {a.T}, n = {a.n}, l' = {a.ls}, random choices (forced 0, b_t, b_t - 1)")
    print("| h | union / exact | gathered / exact | union / gathered |\n|---:|---:|---:|---:|")
    for h in (int(x) for x in a.h.split(",")):
        npos = 64 // h
        starts = list(range(0, a.T, npos))
        if a.blocks:
            starts = sorted(rng.sample(starts, min(a.blocks, len(starts))))
        tot = [0.0, 0.0, 0.0]
        for t0 in starts:
            for i, x in enumerate(block_counts(t0, npos, h, a.n, a.ls, a.T, rng)):
                tot[i] += x
        u, g, e = tot
        print(f"| {h} | {u / e:.2f} | {g / e:.2f} | {u / g:.2f} |")


if __name__ == "__main__":
    main()
