#!/usr/bin/env python3
"""Summarises `ncu --metrics gpu__time_duration.sum --print-summary per-kernel` logs: one table
per profiled process, kernels sorted by total time (avg x invocations), times in ms."""
import re
import sys

from kernel_names import short_kernel_name


def main(path):
    proc, rows = None, []
    def flush():
        if proc and rows:
            total = sum(r[2] * r[1] for r in rows)
            print(f"== {proc}: {total / 1000:.3f} ms over {sum(r[1] for r in rows)} launches")
            for name, n, avg in sorted(rows, key=lambda r: -r[1] * r[2]):
                print(f"  {n * avg / 1000:8.3f} ms  {n:4d} x {avg / 1000:7.4f}  {name[:90]}")
    name = None
    with open(path, errors="replace") as f:
        lines = f.readlines()
    for line in lines:
        m = re.match(r"\[(\d+)\] (\S+)", line)
        if m:
            flush()
            proc, rows = f"{m.group(2)} pid {m.group(1)}", []
            continue
        m = re.match(r"  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\).*Invocations (\d+)", line)
        if m:
            name, n = m.group(1), int(m.group(2))
            name = short_kernel_name(name)
            continue
        m = re.match(r"\s+gpu__time_duration.sum\s+(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
        if m and name:
            scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[m.group(1)]
            rows.append((name, n, float(m.group(4)) * scale))
            name = None
    flush()

if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BrokenPipeError:  # the reader (e.g. `| head`) has what it wanted
        sys.stderr.close()
