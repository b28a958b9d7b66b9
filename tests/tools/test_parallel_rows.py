#!/usr/bin/env python3
"""bench/parallel_rows.py: a row of bench/parallel_gpu.sh's table from a run's metrics, the
first two steps left out, and the speed-up over the one-GPU row of the same micro-batch; and a
row of bench/parallel_cpu.sh's, the first five steps left out."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import parallel_rows  # noqa: E402


def write_metrics(path, tokens_per_s):
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start"}) + "\n")  # not a step: no "loss"
        for i, tok in enumerate(tokens_per_s):
            f.write(json.dumps({"step": i + 1, "loss": 2.0, "tokens_per_s": tok, "ms_per_step": 524288 / tok * 1000,
                                "mfu": 0.25, "peak_mem_bytes": 3 * 2**30}) + "\n")


class ParallelRows(unittest.TestCase):
    def test_speedup_over_the_one_gpu_row(self):
        with tempfile.TemporaryDirectory() as d:
            one, tp2 = os.path.join(d, "one.jsonl"), os.path.join(d, "tp2_dp1.jsonl")
            write_metrics(one, [1.0, 2.0, 300000.0, 300000.0])  # warm-up steps left out
            write_metrics(tp2, [5.0, 6.0, 450000.0, 510000.0])
            row = parallel_rows.summarise(one, "one", 1, os.path.join(d, "one.tok"))
            self.assertIn("300000 tok/s", row)
            self.assertNotIn("x one GPU", row)
            self.assertTrue(os.path.exists(os.path.join(d, "one.tok")))
            row = parallel_rows.summarise(tp2, "tp2_dp1", 2, os.path.join(d, "one.tok"))
            self.assertIn("480000 tok/s", row)
            self.assertTrue(row.endswith("1.600x one GPU"), row)
            self.assertIn("peak 3.0 GiB", row)

    def test_no_base_no_speedup(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "tp2_m32_dp1.jsonl")
            write_metrics(path, [1.0, 1.0, 500000.0])
            row = parallel_rows.summarise(path, "tp2_m32_dp1", 2, os.path.join(d, "one_m32.tok"))
            self.assertNotIn("x one GPU", row)

    def test_profiled_last_step(self):
        with tempfile.TemporaryDirectory() as d:
            path, log = os.path.join(d, "tp2_dp1.jsonl"), os.path.join(d, "tp2_dp1.log")
            write_metrics(path, [1.0, 1.0, 400000.0, 600000.0, 1000.0])  # the profiled last step left out
            with open(log, "w") as f:
                f.write("# step 5: time per op family on rank 0 (log.profile_step), 1016.3 ms\n"
                        "#   tp all-reduce                   39.2 ms    4.1%\n"
                        "#   dp communication: 12.0 ms busy on the GPU, 12.0 ms waited for by the compute stream "
                        "(dp all-reduce): 0% hidden\n"
                        "#   tp communication: 150.4 ms busy on the GPU, 39.2 ms waited for by the compute stream "
                        "(tp all-reduce): 74% hidden\n")
            row = parallel_rows.summarise(path, "tp2_dp1", 2, os.path.join(d, "one.tok"), log)
            self.assertIn("500000 tok/s", row)
            self.assertTrue(row.endswith("peak 3.0 GiB  dp 12 ms busy, 12 ms waited, 0% hidden  "
                                         "tp 150 ms busy, 39 ms waited, 74% hidden"), row)
            with open(log, "w") as f:
                f.write("no profile\n")  # (a CPU run: no busy time, no line)
            self.assertTrue(parallel_rows.summarise(path, "tp2_dp1", 2, "", log).endswith("GiB"))
            write_metrics(path, [1.0, 1.0, 1000.0])
            with self.assertRaises(SystemExit):
                parallel_rows.summarise(path, "tp2_dp1", 2, "", log)

    def test_cpu_row(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "dp2.jsonl")
            write_metrics(path, [1.0] * 5 + [1000.0, 3000.0])  # five warm-up steps left out
            row = parallel_rows.summarise_cpu(path, "dp2", 2)
            self.assertEqual(row.split(), ["dp2", "2", "ranks", "2000", "tok/s", f"{(524288 / 1000 + 524288 / 3000) * 1000 / 2:.1f}",
                                           "ms/step"])
            self.assertFalse(os.path.exists(os.path.join(d, "dp2.tok")))

    def test_too_few_steps(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "one.jsonl")
            write_metrics(path, [1.0, 1.0])
            with self.assertRaises(SystemExit):
                parallel_rows.summarise(path, "one", 1, os.path.join(d, "one.tok"))


if __name__ == "__main__":
    unittest.main()
