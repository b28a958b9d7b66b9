#!/usr/bin/env python3
"""One row of bench/parallel_gpu.sh's table from a run's metrics (log.metrics, one JSON object
per line): the mean tokens/s, ms/step and MFU of its steps from the third on (the first two
warm up), its peak memory, and its speed-up over one GPU at the same micro-batch.

  python3 bench/parallel_rows.py METRICS.jsonl NAME RANKS BASE.tok

A one-rank row (RANKS 1) writes its tokens/s to NAME.tok beside METRICS.jsonl: the base of the
later rows at its micro-batch. A row of more ranks prints its speed-up over BASE.tok where
that file exists (the one-GPU row ran earlier in the same call), else none."""
import json
import os
import sys


def summarise(metrics_path, name, ranks, base_path):
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if '"loss"' in line][2:]
    if not rows:
        raise SystemExit(f"{metrics_path}: no step after the first two")
    tok = sum(r["tokens_per_s"] for r in rows) / len(rows)
    ms = sum(r["ms_per_step"] for r in rows) / len(rows)
    mfu = sum(r["mfu"] for r in rows) / len(rows)
    speedup = ""
    if ranks == 1:
        with open(os.path.join(os.path.dirname(metrics_path), name + ".tok"), "w") as f:
            f.write(repr(tok))
    elif os.path.exists(base_path):
        with open(base_path) as f:
            speedup = f"  {tok / float(f.read()):.3f}x one GPU"
    return (f"{name:12s} {ranks:>3d} GPUs {tok:10.0f} tok/s {ms:9.1f} ms/step  MFU {100 * mfu:4.1f}%  "
            f"peak {rows[-1]['peak_mem_bytes'] / 2**30:.1f} GiB{speedup}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    print(summarise(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
