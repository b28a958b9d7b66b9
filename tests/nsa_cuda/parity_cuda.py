#!/usr/bin/python3
"""`nsatron nsa-parity --device cuda` against `--device cpu` on the same IN.h5 (label gpu).

Fresh random inputs every run (seed printed, --seed reproduces), two shapes with a real
top-n choice. The CPU runs on the float64 file; the GPU runs the same file in fp32 (default)
and with --dtype bf16 on the bf16-rounded values (written to a second float64 file, so the
CPU reference sees exactly what the GPU sees). Metric: max|cuda - cpu| / max|cpu| per
dataset; bounds 1e-5 (fp32) and 1e-2 (bf16); sel_blocks identical (random inputs leave no
near-ties in practice; the C++ test test_nsa_cuda checks ties explicitly). Skips (exit 0,
message) when the device has no GPU. Also: --dtype with --device cpu is an error (exit 2).

Run: python3 parity_cuda.py --nsatron build/launch/nsatron
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

NAMES = ["q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win",
         "gate", "cmp_wk", "cmp_wv", "cmp_pk", "cmp_pv"]
SHAPES = [  # B, T, H, G, D, l, d, l', n, w
    (2, 700, 8, 2, 64, 32, 16, 64, 5, 128),
    (1, 1100, 6, 3, 128, 16, 8, 32, 6, 300),
]


def bf16_round(x):
    """Round float64 values to bf16 (round to nearest even) and back to float64."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def write_input(path, shape, rng, rounder=None):
    B, T, H, G, D, l, d, ls, n, w = shape
    shapes = {k: (B, T, G, D) for k in NAMES}
    shapes.update(q=(B, T, H, D), gate=(B, T, H, 3), cmp_wk=(G, l * D, D), cmp_wv=(G, l * D, D),
                  cmp_pk=(G, l, D), cmp_pv=(G, l, D), d_out=(B, T, H, D))
    data = {}
    for k, s in shapes.items():
        sd = 1.0 / np.sqrt(l * D) if k.startswith("cmp_w") else 1.0
        data[k] = rng.standard_normal(s) * sd
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            f[k] = rounder(v) if rounder else v
        f.attrs.update(cmp_block=np.int64(l), cmp_stride=np.int64(d), sel_block=np.int64(ls),
                       sel_count=np.int64(n), window=np.int64(w), rope_theta=10000.0)
    return data


def compare(cpu_path, gpu_path, bound, what, failures):
    worst = 0.0
    with h5py.File(cpu_path, "r") as c, h5py.File(gpu_path, "r") as g:
        if not np.array_equal(c["sel_blocks"][...], g["sel_blocks"][...]):
            diff = int((c["sel_blocks"][...] != g["sel_blocks"][...]).any(axis=-1).sum())
            failures.append(f"{what}: sel_blocks differ in {diff} rows")
        for k in ["out"] + ["grad_" + n for n in NAMES]:
            ref, got = c[k][...], g[k][...]
            if got.dtype != ref.dtype:
                failures.append(f"{what}: {k} written as {got.dtype}, input was {ref.dtype}")
            m = np.abs(ref).max()
            err = np.abs(got - ref).max() / m if m > 0 else (0.0 if np.abs(got).max() == 0 else np.inf)
            worst = max(worst, err)
            if not err <= bound:
                failures.append(f"{what}: {k} differs by {err:.2e} (bound {bound:.0e})")
    print(f"  {what}: worst {worst:.2e} (bound {bound:.0e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nsatron", required=True)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (--seed reproduces)")
    rng = np.random.default_rng(seed)
    failures = []

    def run(*a):
        return subprocess.run([args.nsatron, "nsa-parity", *a], capture_output=True, text=True)

    with tempfile.TemporaryDirectory() as tmp:
        for si, shape in enumerate(SHAPES):
            state = rng.bit_generator.state
            inp = os.path.join(tmp, f"in{si}.h5")
            write_input(inp, shape, rng)
            cpu, gpu = os.path.join(tmp, f"cpu{si}.h5"), os.path.join(tmp, f"gpu{si}.h5")
            r = run("--in", inp, "--out", cpu, "--device", "cpu")
            if r.returncode != 0:
                failures.append(f"cpu run failed: {r.stderr.strip()}")
                continue
            r = run("--in", inp, "--out", gpu, "--device", "cuda")
            if r.returncode == 2 and "not available" in r.stderr:
                print(f"SKIP: {r.stderr.strip()}")
                return 0
            if r.returncode != 0:
                failures.append(f"cuda run failed ({r.returncode}): {r.stderr.strip()}")
                continue
            print(r.stdout.strip())
            compare(cpu, gpu, 1e-5, f"shape {shape} fp32", failures)

            # bf16: the same draw rounded to bf16, so both sides see the same values.
            rng.bit_generator.state = state
            inp16 = os.path.join(tmp, f"in{si}_bf16.h5")
            write_input(inp16, shape, rng, rounder=bf16_round)
            cpu16 = os.path.join(tmp, f"cpu{si}_bf16.h5")
            gpu16 = os.path.join(tmp, f"gpu{si}_bf16.h5")
            r1 = run("--in", inp16, "--out", cpu16, "--device", "cpu")
            r2 = run("--in", inp16, "--out", gpu16, "--device", "cuda", "--dtype", "bf16")
            if r1.returncode != 0 or r2.returncode != 0:
                failures.append(f"bf16 runs failed: {r1.stderr.strip()} {r2.stderr.strip()}")
                continue
            print(r2.stdout.strip())
            compare(cpu16, gpu16, 1e-2, f"shape {shape} bf16", failures)

        r = run("--in", os.path.join(tmp, "in0.h5"), "--out", os.path.join(tmp, "x.h5"),
                "--dtype", "bf16")
        if not (r.returncode == 2 and "--dtype" in r.stderr):
            failures.append(f"--dtype without --device cuda: exit {r.returncode}: {r.stderr.strip()}")
        r = run("--in", os.path.join(tmp, "in0.h5"), "--out", os.path.join(tmp, "x.h5"),
                "--device", "cuda", "--dtype", "fp16")
        if not (r.returncode == 2 and "--dtype" in r.stderr):
            failures.append(f"--dtype fp16: exit {r.returncode}: {r.stderr.strip()}")

    for f in failures:
        print("FAIL:", f)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
