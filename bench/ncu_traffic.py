#!/usr/bin/env python3
"""Memory traffic and tensor-pipe use per kernel from an ncu CSV (docs/performance.md, tenth
session: where the bytes go at the paper's 64k). Take the CSV with

  ncu --clock-control none --cache-control none --csv -k regex:'row_|key_|cmp_select' \\
      --metrics "$(python3 bench/ncu_traffic.py --metrics)" COMMAND ... > OUT.csv

then `python3 bench/ncu_traffic.py OUT.csv [--top 14]` prints, per kernel (launches of the same
kernel averaged), its time, DRAM bytes read and written, L2 bytes and hit rate, the L2 and DRAM
rates, the tensor pipe's active share and the LSU issue share, largest total time first."""
import argparse
import collections
import csv
import sys

from kernel_names import short_kernel_name

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "lts__t_sector_hit_rate.pct",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
]
# Units as ncu writes them, to ms (times) or GB (bytes); percentages stay as they are.
SCALE = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
         "s": 1e3, "second": 1e3, "byte": 1e-9, "Kbyte": 1e-6, "KB": 1e-6, "Mbyte": 1e-3, "MB": 1e-3,
         "Gbyte": 1.0, "GB": 1.0, "Tbyte": 1e3, "%": 1.0, "": 1.0}


def parse(lines):
    """{kernel: {metric: [value per launch, scaled]}} from ncu's --csv rows."""
    rows = list(csv.reader(lines))
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Name" in r)
    hdr = rows[start]
    ki, mi, ui, vi = (hdr.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    acc = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows[start + 1:]:
        if len(r) != len(hdr):
            continue
        unit = r[ui]
        if unit not in SCALE:
            raise ValueError(f"unknown unit {unit!r} of {r[mi]}")
        acc[short_kernel_name(r[ki])][r[mi]].append(float(r[vi].replace(",", "")) * SCALE[unit])
    return acc


def table(acc, top):
    def avg(m, n):
        v = m.get(n)
        return sum(v) / len(v) if v else float("nan")
    out = []
    for k, m in acc.items():
        t = avg(m, METRICS[0])
        out.append((t * len(m.get(METRICS[0], [0])), k, t, avg(m, METRICS[1]), avg(m, METRICS[2]), avg(m, METRICS[3]),
                    avg(m, METRICS[4]), avg(m, METRICS[5]), avg(m, METRICS[6])))
    lines = [f"{'kernel':44s} {'ms':>8s} {'DRAM rd GB':>10s} {'wr GB':>6s} {'L2 GB':>7s} {'hit%':>5s} "
             f"{'L2 TB/s':>7s} {'DRAM TB/s':>9s} {'tensor%':>7s} {'lsu%':>5s}"]
    for _, k, t, dr, dw, l2, hit, tc, lsu in sorted(out, reverse=True)[:top]:
        lines.append(f"{k[:44]:44s} {t:8.3f} {dr:10.2f} {dw:6.2f} {l2:7.2f} {hit:5.1f} {l2 / t:7.2f} {dr / t:9.2f} "
                     f"{tc:7.1f} {lsu:5.1f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu --metrics")
    args = ap.parse_args()
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if not args.csv:
        ap.error("the CSV is required")
    with open(args.csv, errors="replace") as f:
        print(table(parse(f), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
