#!/usr/bin/env python3
"""One row of the parallel benchmarks' tables from a run's metrics (log.metrics, one JSON object
per line): the means over its steps after the warm-up ones.

  python3 bench/parallel_rows.py METRICS.jsonl NAME RANKS BASE.tok      (bench/parallel_gpu.sh)
  python3 bench/parallel_rows.py --cpu METRICS.jsonl NAME RANKS          (bench/parallel_cpu.sh)

GPU rows: tokens/s, ms/step, MFU and peak memory of the steps from the third on, and the
speed-up over one GPU at the same micro-batch. A one-rank row (RANKS 1) writes its tokens/s to
NAME.tok beside METRICS.jsonl: the base of the later rows at its micro-batch. A row of more
ranks prints its speed-up over BASE.tok where that file exists (the one-GPU row ran earlier in
the same call), else none. CPU rows: tokens/s and ms/step of the steps from the sixth on."""
import json
import os
import sys

GPU_WARMUP_STEPS, CPU_WARMUP_STEPS = 2, 5


def steps_after_warmup(metrics_path, warmup):
    """The step records (those with a loss) after the first `warmup` of them."""
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if '"loss"' in line][warmup:]
    if not rows:
        raise SystemExit(f"{metrics_path}: no step after the first {warmup}")
    return rows


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def summarise(metrics_path, name, ranks, base_path):
    rows = steps_after_warmup(metrics_path, GPU_WARMUP_STEPS)
    tok = mean(rows, "tokens_per_s")
    speedup = ""
    if ranks == 1:
        with open(os.path.join(os.path.dirname(metrics_path), name + ".tok"), "w") as f:
            f.write(repr(tok))
    elif os.path.exists(base_path):
        with open(base_path) as f:
            speedup = f"  {tok / float(f.read()):.3f}x one GPU"
    return (f"{name:12s} {ranks:>3d} GPUs {tok:10.0f} tok/s {mean(rows, 'ms_per_step'):9.1f} ms/step  "
            f"MFU {100 * mean(rows, 'mfu'):4.1f}%  peak {rows[-1]['peak_mem_bytes'] / 2**30:.1f} GiB{speedup}")


def summarise_cpu(metrics_path, name, ranks):
    rows = steps_after_warmup(metrics_path, CPU_WARMUP_STEPS)
    return f"{name:10s} {ranks:>5d} ranks {mean(rows, 'tokens_per_s'):9.0f} tok/s {mean(rows, 'ms_per_step'):8.1f} ms/step"


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--cpu":
        print(summarise_cpu(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    elif len(sys.argv) == 5:
        print(summarise(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    else:
        raise SystemExit(__doc__)
