#!/usr/bin/env python3
"""bench/ncu_table.py reads `ncu --metrics gpu__time_duration.sum --print-summary per-kernel`
logs: a table per profiled process, kernels by total time, names as bench/kernel_names.py
shortens them, times in ms whatever unit ncu wrote."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import ncu_table  # noqa: E402

LOG = """==PROF== Connected to process 5339
[5339] bench_nsa_gpu@127.0.0.1
  void nsatron::nsa::cuda::detail::<unnamed>::tc::key_kernel<128, 0>(nsatron::nsa::cuda::detail::Geo, nsatron::nsa::cuda::detail::KeyArgs, int) (14, 1, 4)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0, Invocations 2
    Section: Command line profiler metrics
    ---------------------------------------------------------------------- ----------- ------------ ------------ ------------
    Metric Name                                                            Metric Unit Minimum      Maximum      Average
    ---------------------------------------------------------------------- ----------- ------------ ------------ ------------
    gpu__time_duration.sum                                                     msecond        21.60        21.66        21.63
    ---------------------------------------------------------------------- ----------- ------------ ------------ ------------
  nvjet_sm90_tss_256x128_64x4_1x2_h_badd_coopA_TNT (48, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0, Invocations 3
    gpu__time_duration.sum                                                     usecond        12.00        13.00        12.40
"""


class NcuTable(unittest.TestCase):
    def test_table(self):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(LOG)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                ncu_table.main(f.name)
        finally:
            os.unlink(f.name)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "== bench_nsa_gpu@127.0.0.1 pid 5339: 43.297 ms over 5 launches")
        self.assertEqual(lines[1].split(), ["43.260", "ms", "2", "x", "21.6300", "tc::key_kernel<128,", "0>"])
        self.assertEqual(lines[2].split()[:5], ["0.037", "ms", "3", "x", "0.0124"])
        self.assertTrue(lines[2].endswith("nvjet_sm90_tss_256x128_64x4_1x2_h_badd_coopA_TNT"))


if __name__ == "__main__":
    unittest.main()
