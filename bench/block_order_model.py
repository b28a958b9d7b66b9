#!/usr/bin/env python3
"""A list-scheduling model of a kernel's tail: how long the last block runs past the mean.

The hardware starts a grid's blocks in linear order (x fastest, then y, then z) into the
resident slots (SMs x blocks per SM) and starts the next block wherever one ends. Where the
blocks' work differs, the order decides the tail: a heavy block that starts late ends late.
This model gives each slot a constant speed (one unit of work per unit of time) and prints
makespan / (total work / slots): 1.0 is a perfect balance.

The case it was written for (docs/performance.md, twentieth session): the window key side
(nsa/cuda/attention_tc.cuh, key_kernel with BR = kWin) at w = T, the own dense kernel. Tile t of
a (batch, group) sees the rows of positions [64 t, T), (T - 64 t) h of them, in batches of 64.
With x = tile and z = (batch, group) the last pairs' heaviest tiles start last; tile-major
(key_tile_major) starts every pair's heaviest tiles first. The row kernels' blocks at w = T
attend every key up to their last position: the opposite slope, heaviest last, and many more
blocks (row_heaviest_first reverses them and alternates the pairs).

  /usr/bin/python3 bench/block_order_model.py              # the paper's 8192 and the 125M layer
  /usr/bin/python3 bench/block_order_model.py --T 65536 --pairs 4 --h 16 --slots 264
"""
import argparse
import heapq


def makespan(works, slots):
    """Blocks in launch order, each to the slot that frees first; the last end / the mean."""
    ends = [0.0] * slots
    heapq.heapify(ends)
    last = 0.0
    for w in works:
        start = heapq.heappop(ends)
        heapq.heappush(ends, start + w)
        last = max(last, start + w)
    return last / (sum(works) / slots)


def dense_key_side(T, pairs, h, tile_major):
    """Row batches (64 rows) of every window key-side block at w = T, in launch order."""
    tiles = (T + 63) // 64
    work = [(T - 64 * t) * h / 64 for t in range(tiles)]
    if tile_major:
        return [work[t] for t in range(tiles) for _ in range(pairs)]
    return [work[t] for _ in range(pairs) for t in range(tiles)]


def dense_row_side(T, pairs, h, heaviest_first):
    """Key tiles (64 keys) of every row block (64 rows: 64 / h positions) at w = T, in launch order."""
    nblocks = (T * h + 63) // 64
    work = [min(T - 1, (64 * x + 63) // h) // 64 + 1 for x in range(nblocks)]
    if heaviest_first:
        return [work[x] for x in reversed(range(nblocks)) for _ in range(pairs)]
    return [work[x] for _ in range(pairs) for x in range(nblocks)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="*", help="sequence length (with --pairs, --h, --slots)")
    ap.add_argument("--pairs", type=int, default=4, help="batch x KV groups")
    ap.add_argument("--h", type=int, default=16, help="query heads per group")
    ap.add_argument("--slots", type=int, default=264, help="resident blocks (SMs x blocks per SM)")
    args = ap.parse_args()
    cases = [(T, args.pairs, args.h, args.slots) for T in args.T] if args.T else [
        (8192, 4, 16, 264),   # paper 8192: B = 1, G = 4, h = 16, D = 128 (2 blocks per SM, 132 SMs)
        (2048, 32, 6, 396),   # 125M layer: B = 16, G = 2, h = 6, D = 64 (3 blocks per SM)
    ]
    print("key side (key_tile_major)            row side (row_heaviest_first)")
    print("T       pairs  h   slots  pair-major  tile-major  pair-major  heaviest-first")
    for T, pairs, h, slots in cases:
        a = makespan(dense_key_side(T, pairs, h, False), slots)
        b = makespan(dense_key_side(T, pairs, h, True), slots)
        c = makespan(dense_row_side(T, pairs, h, False), slots)
        d = makespan(dense_row_side(T, pairs, h, True), slots)
        print(f"{T:<7d} {pairs:<6d} {h:<3d} {slots:<6d} {a:10.3f}  {b:10.3f}  {c:10.3f}  {d:10.3f}")


if __name__ == "__main__":
    main()
