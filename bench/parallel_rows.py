#!/usr/bin/env python3
"""One row of the parallel benchmarks' tables from a run's metrics (log.metrics, one JSON object
per line): the means over its steps after the warm-up ones.

  python3 bench/parallel_rows.py METRICS.jsonl NAME RANKS BASE.tok [RUN.log]   (bench/parallel_gpu.sh)
  python3 bench/parallel_rows.py --cpu METRICS.jsonl NAME RANKS          (bench/parallel_cpu.sh)

GPU rows: tokens/s, ms/step, MFU and peak memory of the steps from the third on, and the
speed-up over one GPU at the same micro-batch. A one-rank row (RANKS 1) writes its tokens/s to
NAME.tok beside METRICS.jsonl: the base of the later rows at its micro-batch. A row of more
ranks prints its speed-up over BASE.tok where that file exists (the one-GPU row ran earlier in
the same call), else none. With RUN.log (the run's output, its last step profiled by
log.profile_step) that step is left out of the means too, and the row ends with each group's
communication from the profile: the fraction of its busy time on the GPU the compute stream did
not wait for (core/util/op_timer.h, hidden_lines). CPU rows: tokens/s and ms/step of the steps
from the sixth on."""
import json
import os
import re
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


# A line of the profile (launch/train/step.cpp, print_profile) per group with busy time.
HIDDEN = re.compile(r"^# +(\w+) communication: ([0-9.]+) ms busy on the GPU, ([0-9.]+) ms waited for by the "
                    r"compute stream \(.*\): ([0-9]+)% hidden$")


def hidden_of(log_path):
    """'  tp 150 ms busy, 39 ms waited, 74% hidden' per group profiled in the run's output, in its order."""
    with open(log_path, errors="replace") as f:
        found = [HIDDEN.match(line.rstrip("\n")) for line in f]
    return "".join(f"  {m.group(1)} {float(m.group(2)):.0f} ms busy, {float(m.group(3)):.0f} ms waited, {m.group(4)}% hidden"
                   for m in found if m)


def summarise(metrics_path, name, ranks, base_path, log_path=None):
    rows = steps_after_warmup(metrics_path, GPU_WARMUP_STEPS)
    if log_path:  # the profiled last step: not in the means
        rows = rows[:-1]
        if not rows:
            raise SystemExit(f"{metrics_path}: no step after the warm-up but the profiled one")
    tok = mean(rows, "tokens_per_s")
    speedup = ""
    if ranks == 1:
        with open(os.path.join(os.path.dirname(metrics_path), name + ".tok"), "w") as f:
            f.write(repr(tok))
    elif os.path.exists(base_path):
        with open(base_path) as f:
            speedup = f"  {tok / float(f.read()):.3f}x one GPU"
    hidden = hidden_of(log_path) if log_path else ""
    return (f"{name:20s} {ranks:>3d} GPUs {tok:10.0f} tok/s {mean(rows, 'ms_per_step'):9.1f} ms/step  "
            f"MFU {100 * mean(rows, 'mfu'):4.1f}%  peak {rows[-1]['peak_mem_bytes'] / 2**30:.1f} GiB{speedup}{hidden}")


def summarise_cpu(metrics_path, name, ranks):
    rows = steps_after_warmup(metrics_path, CPU_WARMUP_STEPS)
    return f"{name:10s} {ranks:>5d} ranks {mean(rows, 'tokens_per_s'):9.0f} tok/s {mean(rows, 'ms_per_step'):8.1f} ms/step"


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--cpu":
        print(summarise_cpu(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    elif len(sys.argv) in (5, 6):
        print(summarise(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) == 6 else None))
    else:
        raise SystemExit(__doc__)
