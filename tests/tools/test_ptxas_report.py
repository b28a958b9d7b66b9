#!/usr/bin/env python3
"""bench/ptxas_report.py reads ptxas's -v output as it is written: registers and spills per
kernel, the costly warnings attached to the kernel they name (which ptxas may print before that
kernel's own lines), kernel names shortened to their templates, and each kernel's machine code
from a cubin's ".text." sections (an ELF file built here, laid out as nvcc's are)."""
import hashlib
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import kernel_names  # noqa: E402
import ptxas_report  # noqa: E402

# Two kernels as nvcc 13 prints them; the second's warning comes before its own lines.
LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3fooILi128EEvi' for 'sm_90a'
ptxas info    : Function properties for _Z3fooILi128EEvi
    0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 384 bytes cmem[0]
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function '_Z3barv'
ptxas info    : (C7517) warpgroup.wait is injected in around line 209548 by compiler to allow use of registers defined by GMMA in function '_Z3barv'
ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'
ptxas info    : Function properties for _Z3barv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 204 registers, used 1 barriers, 380 bytes cmem[0]
"""


class ParseTest(unittest.TestCase):
    def test_registers_spills_and_warnings(self):
        k = ptxas_report.parse(LOG)
        self.assertEqual(set(k), {"_Z3fooILi128EEvi", "_Z3barv"})
        self.assertEqual(k["_Z3fooILi128EEvi"]["regs"], 168)
        self.assertEqual(k["_Z3fooILi128EEvi"]["spill"], (24, 16))
        self.assertEqual(k["_Z3fooILi128EEvi"]["warnings"], [])
        self.assertEqual(k["_Z3barv"]["regs"], 204)
        self.assertEqual(k["_Z3barv"]["spill"], (0, 0))
        codes = [w.split(":")[0] for w in k["_Z3barv"]["warnings"]]
        self.assertEqual(codes, ["C7515", "C7517"])
        self.assertIn("serialized", k["_Z3barv"]["warnings"][0])
        self.assertNotIn("_Z3barv", k["_Z3barv"]["warnings"][1])  # the function's name left out

    def test_other_messages_are_not_costly(self):
        k = ptxas_report.parse("ptxas info    : Compiling entry function 'f' for 'sm_90a'\n"
                               "ptxas info    : (C7000) something else in the function 'f'\n"
                               "ptxas info    : Used 32 registers\n")
        self.assertEqual(k["f"]["warnings"], [])

    def test_short_name(self):  # bench/kernel_names.py, which every tool prints kernels with
        short = kernel_names.short_kernel_name
        self.assertEqual(
            short("void nsatron::nsa::cuda::detail::(anonymous namespace)::tc::row_kernel<128, 1, "
                  "true, false>(nsatron::nsa::cuda::detail::Geo, int)"),
            "tc::row_kernel<128, 1, true, false>")
        # ncu's form of the anonymous namespace, and its "(int)" template arguments.
        self.assertEqual(short("void nsatron::nsa::cuda::detail::<unnamed>::tc::key_kernel<(int)128, (int)0>"
                               "(nsatron::nsa::cuda::detail::Geo, int)"), "tc::key_kernel<(int)128, (int)0>")
        self.assertEqual(short("nsatron::nsa::cuda::detail::key_kernel<float, 128, 0>(Geo)"),
                         "detail::key_kernel<float, 128, 0>")
        self.assertEqual(short("nvjet_sm90_tss_256x128_64x4_1x2_h_badd_coopA_TNT"),
                         "nvjet_sm90_tss_256x128_64x4_1x2_h_badd_coopA_TNT")
        self.assertEqual(short("f(int)"), "f")
        self.assertEqual(short("k<(int)2>(float*)"), "k<(int)2>")

    def test_costly_kernels(self):
        named = {"gone<1>": None}  # a kernel only the base had
        named.update({kernel_names.short_kernel_name(n): rec for n, rec in ptxas_report.parse(LOG).items()})
        self.assertEqual(ptxas_report.costly_kernels(named), ["_Z3barv"])

    def test_describe(self):
        self.assertEqual(ptxas_report.describe({"regs": 150, "spill": (0, 0), "warnings": []}), "150 regs")
        self.assertEqual(ptxas_report.describe({"regs": 168, "spill": (24, 16), "warnings": []}),
                         "168 regs, spills 24/16 B")
        self.assertEqual(ptxas_report.describe(None), "-")


def tiny_elf(sections):
    """An ELF64 little-endian file with a null section, the given (name, bytes) sections and the
    section names' string table (last), as a cubin lays its kernels' code out."""
    names = b"\0"
    offsets = []
    for n, _ in sections + [(".shstrtab", b"")]:
        offsets.append(len(names))
        names += n.encode() + b"\0"
    body = b""
    placed = []
    data_at = 64  # right after the file header
    for (_, code) in sections + [(".shstrtab", names)]:
        placed.append((data_at + len(body), len(code)))
        body += code
    shoff = data_at + len(body)
    shnum = len(sections) + 2
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, shnum, shnum - 1)
    table = bytes(64)  # the null section
    for name_off, (offset, size) in zip(offsets, placed):
        table += struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, offset, size, 0, 0, 1, 0)
    return header + body + table


class CubinCodeTest(unittest.TestCase):
    def test_text_sections_and_hashes(self):
        foo, bar = b"\x01\x02\x03\x04" * 4, b"\xaa" * 24
        elf = tiny_elf([(".text._Z3foov", foo), (".nv.info._Z3foov", b"\x00" * 8), (".text._Z3barv", bar)])
        self.assertEqual(ptxas_report.text_sections(elf), {".text._Z3foov": foo, ".text._Z3barv": bar})
        self.assertEqual(ptxas_report.code_hashes(elf), {"_Z3foov": hashlib.sha1(foo).hexdigest(),
                                                         "_Z3barv": hashlib.sha1(bar).hexdigest()})
        # One instruction changed: that kernel's hash alone.
        changed = ptxas_report.code_hashes(tiny_elf([(".text._Z3foov", foo), (".text._Z3barv", b"\xab" + bar[1:])]))
        self.assertEqual(changed["_Z3foov"], hashlib.sha1(foo).hexdigest())
        self.assertNotEqual(changed["_Z3barv"], hashlib.sha1(bar).hexdigest())

    def test_not_an_elf(self):
        with self.assertRaises(ValueError):
            ptxas_report.text_sections(b"ptxas info: not a cubin")


if __name__ == "__main__":
    unittest.main()
