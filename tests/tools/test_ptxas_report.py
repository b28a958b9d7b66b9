#!/usr/bin/env python3
"""bench/ptxas_report.py reads ptxas's -v output as it is written: registers and spills per
kernel, the costly warnings attached to the kernel they name (which ptxas may print before that
kernel's own lines), and kernel names shortened to their templates."""
import os
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


if __name__ == "__main__":
    unittest.main()
