#!/usr/bin/env python3
"""Where one kernel's warps wait, by SASS instruction: summarises the CSV of
`ncu -i REPORT --page source --csv --print-source sass` for a report taken with
`ncu --section SourceCounters --section WarpStateStats -k regex:KERNEL --launch-count 1 -o REPORT ...`.

Prints the kernel's warp-state samples in buckets of --bucket consecutive instructions (each with
its first instruction, to find the place in the code) and the --top instructions with the most
samples, each with its two largest stall reasons. A stall is charged to the instruction a warp
waits to issue: a barrier's wait shows on the instruction after the BAR, a load's on its first
use. docs/performance.md (eighth session) shows how the row and fused kernels were read this way;
bench/ncu_sass.sh takes the profile and runs this on it.

  python3 bench/ncu_sass.py sass.csv [--bucket 50] [--top 25] [--min-share 0.01]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--bucket", type=int, default=50, help="instructions per bucket")
    ap.add_argument("--top", type=int, default=25, help="instructions listed")
    ap.add_argument("--min-share", type=float, default=0.01, help="smallest bucket share printed")
    args = ap.parse_args()

    rows = list(csv.reader(open(args.csv, errors="replace")))
    # Row 0 names the kernel, row 1 the columns; every later row is one SASS instruction.
    header_row = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header, body = rows[header_row], [r for r in rows[header_row + 1:] if len(r) == len(rows[header_row])]
    col = {name: i for i, name in enumerate(header)}
    samples_col = col["Warp Stall Sampling (All Samples)"]
    stall_cols = [(i, h[len("stall_"):]) for i, h in enumerate(header)
                  if h.startswith("stall_") and "Not Issued" not in h]

    def number(text):
        try:
            return int(float(text))
        except ValueError:
            return 0

    insts = []
    for idx, r in enumerate(body):
        reasons = sorted(((number(r[i]), name) for i, name in stall_cols), reverse=True)[:2]
        insts.append((idx, number(r[samples_col]), r[col["Source"]].strip(), reasons))
    total = sum(s for _, s, _, _ in insts) or 1
    if rows[0] and len(rows[0]) > 1:
        print(f"kernel: {rows[0][1][:150]}")
    print(f"{len(insts)} instructions, {total} samples\n")

    print(f"samples per {args.bucket} instructions (share >= {args.min_share:.0%}; cumulative):")
    cumulative = 0
    for start in range(0, len(insts), args.bucket):
        chunk = insts[start:start + args.bucket]
        s = sum(x[1] for x in chunk)
        cumulative += s
        if s / total >= args.min_share:
            print(f"  {start:6d}  {s:9d}  {s / total:6.1%}  {cumulative / total:6.1%}  {chunk[0][2][:60]}")

    print(f"\nthe {args.top} instructions with the most samples:")
    for idx, s, text, reasons in sorted(insts, key=lambda x: -x[1])[:args.top]:
        why = ", ".join(f"{name} {n}" for n, name in reasons if n)
        print(f"  {idx:6d}  {s:8d}  {s / total:6.1%}  {text[:58]:58s}  {why}")


if __name__ == "__main__":
    main()
