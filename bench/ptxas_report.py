#!/usr/bin/env python3
"""What ptxas made of each CUDA kernel, without a GPU: registers, spilled bytes, and the
warnings that cost speed silently (warpgroup products serialised, C7510-C7520; a
warpgroup.wait inserted by the compiler, C7517). With --base, the same for another commit,
and only the kernels that changed, where a change of the machine code counts too (each
kernel's .text section of the cubin, compared byte for byte): "no kernel changed" means every
kernel compiles to the same instructions, so a refactor that says so needs no GPU run to keep
its bits and speed (docs/performance.md, 2026-11-29, twenty-fourth session).

Compiles each file as the build does (nvcc -std=c++20 --expt-relaxed-constexpr -lineinfo -O3
-arch ARCH, sm_90a with NSATRON_BUILD_SM90A) to a cubin with -Xptxas -v, the files in parallel:

  python3 bench/ptxas_report.py                      # the NSA kernels of the working tree
  python3 bench/ptxas_report.py --base HEAD          # what the working tree changed
  python3 bench/ptxas_report.py --match row_kernel core/ops/cuda/rmsnorm.cu

Exits 1 when a kernel of the working tree has a serialisation or inserted-wait warning (so a
change that makes ptxas serialise the products is seen before any GPU time is spent: a
deferred product measured 27% slower for that reason, docs/performance.md, ninth session).
"""
import argparse
import concurrent.futures
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile

from kernel_names import short_kernel_name

DEFAULT_FILES = ["nsa/cuda/attention.cu", "nsa/cuda/compression.cu", "nsa/cuda/selection.cu"]
# ptxas messages that mean the warpgroup products do not run as written.
COSTLY = re.compile(r"\((C75(1\d|20))\)")


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, out.stdout.splitlines()))


def parse(log):
    """{mangled kernel: {"regs": int, "spill": (stores, loads), "warnings": [code: text]}} from the
    -Xptxas -v output of one compilation."""
    kernels, current = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = kernels.setdefault(m.group(1), {"regs": None, "spill": (0, 0), "warnings": []})
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current is not None:
            current["spill"] = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["regs"] = int(m.group(1))
        m = COSTLY.search(line)
        if m:  # these name their function, which may be compiled before or after the message
            f = re.search(r"function '([^']+)'", line)
            target = kernels.setdefault(f.group(1), {"regs": None, "spill": (0, 0), "warnings": []}) if f else current
            if target is not None:
                text = line.split(")", 1)[1].split(" in the function")[0].split(" in function")[0].strip()
                target["warnings"].append(f"{m.group(1)}: {text}")
    return kernels


def text_sections(elf):
    """{section name: bytes} of the sections of an ELF64 little-endian file (a cubin) whose names
    start with ".text." (nvcc gives each kernel its own: ".text." + its mangled name)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]  # the section names' string table: its file offset

    def name(offset):
        start = names_at + offset
        return elf[start:elf.index(b"\0", start)].decode()

    out = {}
    for name_off, _type, _flags, _addr, offset, size in headers:
        n = name(name_off)
        if n.startswith(".text."):
            out[n] = elf[offset:offset + size]
    return out


def code_hashes(elf):
    """{mangled kernel: sha1 of its machine code} of a cubin."""
    return {n[len(".text."):]: hashlib.sha1(code).hexdigest() for n, code in text_sections(elf).items()}


def compile_file(root, path, arch):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["nvcc", "-std=c++20", "--expt-relaxed-constexpr", "-lineinfo", "-O3", f"-I{root}",
               f"-arch={arch}", "-DNSATRON_WITH_CUDA=1"]
        if arch.endswith("a"):  # as nsa/CMakeLists.txt defines it for a 90a build
            cmd.append("-DNSATRON_BUILD_SM90A=1")
        cmd += ["-cubin", "-Xptxas", "-v", "-o", os.path.join(tmp, "out.cubin"), os.path.join(root, path)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{path}: nvcc failed\n{res.stderr[-3000:]}")
        with open(os.path.join(tmp, "out.cubin"), "rb") as f:
            return res.stdout + res.stderr, code_hashes(f.read())


def report(root, files, arch):
    """{short kernel name: record} over the files, compiled in parallel."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        logs = list(pool.map(lambda f: compile_file(root, f, arch), files))
    merged = {}
    for log, codes in logs:
        kernels = parse(log)
        names = demangle(sorted(kernels))
        for mangled, rec in kernels.items():
            rec["code"] = codes.get(mangled)
            merged[short_kernel_name(names[mangled])] = rec
    return merged


def costly_kernels(records):
    """The kernels (sorted) with a serialisation or inserted-wait warning."""
    return sorted(n for n, rec in records.items() if rec and rec["warnings"])


def describe(rec):
    if rec is None:
        return "-"
    st, ld = rec["spill"]
    return f"{rec['regs']} regs" + (f", spills {st}/{ld} B" if st or ld else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=DEFAULT_FILES, help="CUDA files, relative to the root")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--base", help="a commit to compare with (its files from git archive)")
    ap.add_argument("--match", default="", help="only kernels whose name contains this")
    args = ap.parse_args()

    now = report(args.root, args.files, args.arch)
    base = None
    if args.base:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", args.root, "archive", args.base], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            base = report(tmp, args.files, args.arch)

    names = sorted(n for n in set(now) | set(base or {}) if args.match in n)
    shown = 0
    for n in names:
        rec, old = now.get(n), (base or {}).get(n)
        same_build = base is not None and rec is not None and old is not None and \
            (rec["regs"], rec["spill"], rec["warnings"]) == (old["regs"], old["spill"], old["warnings"])
        if same_build and rec.get("code") == old.get("code"):
            continue
        line = f"{n:60s} " + (f"{describe(old):>24s} -> " if base is not None else "") + f"{describe(rec):>24s}"
        if same_build:
            line += "  (machine code changed)"
        print(line)
        for w in (rec or {}).get("warnings", []):
            print(f"    {w}")
        shown += 1
    if base is not None and shown == 0:
        print(f"no kernel changed against {args.base} ({len(names)} compared, machine code included)")
    costly = costly_kernels({n: now.get(n) for n in names})
    if costly:
        print(f"\n{len(costly)} kernel(s) with serialised or waited-for warpgroup products: {', '.join(costly)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
