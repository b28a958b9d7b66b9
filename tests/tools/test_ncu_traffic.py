#!/usr/bin/env python3
"""bench/ncu_traffic.py reads ncu's --csv metric rows: units scaled to ms and GB, launches of a
kernel averaged, kernels named without their namespaces' prefix and parameter list, the rates
derived per kernel, and an unknown unit refused rather than misread."""
import io
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import ncu_traffic  # noqa: E402

K1 = "void ns::(anonymous namespace)::tc::row_kernel<128, 1, 1, 0>(ns::Geo, int)"
K2 = "void ns::(anonymous namespace)::tc::key_kernel<128, 0>(ns::Geo, int)"


def row(i, kernel, metric, unit, value):
    return f'"{i}","1","bench","127.0.0.1","{kernel}","1","(1, 1, 1)","(128, 1, 1)","9.0","SOL","{metric}","{unit}","{value}"\n'


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Grid Size","Block Size",'
          '"CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def sample(time_unit="ns"):
    text = "==PROF== Connected to process\n" + HEADER
    # K1 twice (21 and 23 ms: average 22), K2 once.
    for i, t in ((0, "21,000,000"), (1, "23,000,000")):
        text += row(i, K1, "gpu__time_duration.sum", time_unit, t)
        text += row(i, K1, "lts__t_bytes.sum", "Gbyte", "110")
        text += row(i, K1, "dram__bytes_read.sum", "Mbyte", "9,000")
        text += row(i, K1, "lts__t_sector_hit_rate.pct", "%", "90")
    text += row(2, K2, "gpu__time_duration.sum", "ms", "5")
    text += row(2, K2, "lts__t_bytes.sum", "byte", "20000000000")
    return text


class ParseTest(unittest.TestCase):
    def test_units_averages_and_names(self):
        acc = ncu_traffic.parse(io.StringIO(sample()))
        self.assertEqual(set(acc), {"tc::row_kernel<128, 1, 1, 0>", "tc::key_kernel<128, 0>"})
        k1 = acc["tc::row_kernel<128, 1, 1, 0>"]
        self.assertEqual(len(k1["gpu__time_duration.sum"]), 2)
        self.assertAlmostEqual(sum(k1["gpu__time_duration.sum"]) / 2, 22.0)  # ms
        self.assertAlmostEqual(k1["dram__bytes_read.sum"][0], 9.0)  # GB
        self.assertAlmostEqual(acc["tc::key_kernel<128, 0>"]["lts__t_bytes.sum"][0], 20.0)

    def test_table_rates_and_order(self):
        lines = ncu_traffic.table(ncu_traffic.parse(io.StringIO(sample())), 10).splitlines()
        self.assertTrue(lines[1].startswith("tc::row_kernel<128, 1, 1, 0>"))  # 44 ms in all, first
        cells = lines[1].split()
        # ms, DRAM read, write (absent: nan), L2 GB, hit, L2 TB/s = 110 GB / 22 ms
        self.assertEqual(cells[4:6], ["22.000", "9.00"])
        self.assertEqual(cells[7:10], ["110.00", "90.0", "5.00"])
        self.assertTrue(lines[2].startswith("tc::key_kernel<128, 0>"))

    def test_unknown_unit_is_refused(self):
        with self.assertRaises(ValueError):
            ncu_traffic.parse(io.StringIO(sample(time_unit="fortnight")))


if __name__ == "__main__":
    unittest.main()
