"""h5py reads a checkpoint written by nsatron and finds the layout docs/checkpoint.md documents.

Runs ckpt_example_writer (a small C++ program saving a checkpoint with predictable values),
opens the file with h5py alone, and checks: the directory layout and `latest`, every root
attribute, the manifest, dataset names, dtypes, shapes, global_shape/offset attributes, each
dataset's crc32 against zlib.crc32 of its bytes (read through h5py and read raw from the file
at the dataset's offset), state_crc32 against the documented digest text, and the values.
Then damages copies with h5py (deletes a dataset, flips a data byte) and expects
`nsatron ckpt verify` to name each.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

import h5py
import numpy as np

PARAMS = [  # as in ckpt_test_util.h small_model(), in declaration order
    ("model/embedding", (16, 8)),
    ("model/layers.0/attn_norm", (8,)),
    ("model/layers.0/attn/wqkv", (24, 8)),
    ("model/layers.0/attn/cmp_wk", (2, 12, 4)),
    ("model/layers.1/mlp/w_in", (10, 8)),
    ("model/final_norm", (8,)),
]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def as_text(x):
    """A string attribute (fixed-length: h5py gives bytes) or an integer, as text."""
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def digest_text(attrs, manifest):
    keys = ["format", "format_version", "step", "consumed_tokens", "optimizer_step", "sampler_position",
            "rng", "config", "rank", "num_files", "layout"]
    out = "".join(f"{k}={as_text(attrs[k])}\n" for k in keys)
    out += "datasets=" + "\n".join(manifest) + "\n"
    for k in sorted(k for k in attrs if k.startswith("extra.")):
        out += f"{k}={as_text(attrs[k])}\n"
    return out


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nsatron")
    ap.add_argument("--writer", required=True)
    ap.add_argument("--tool", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="nsatron_h5py_")
    try:
        run_dir = os.path.join(tmp, "checkpoints")
        out = subprocess.run([a.writer, run_dir], capture_output=True, text=True, check=True).stdout.strip()
        step_dir = os.path.join(run_dir, "step_00000100")
        check(out == step_dir, f"writer returned {out}")
        check(sorted(os.listdir(run_dir)) == ["latest", "step_00000100"], f"run dir holds {os.listdir(run_dir)}")
        check(open(os.path.join(run_dir, "latest")).read() == "step_00000100\n", "latest content")
        check(os.listdir(step_dir) == ["rank_00000.h5"], f"step dir holds {os.listdir(step_dir)}")
        path = os.path.join(step_dir, "rank_00000.h5")

        with h5py.File(path, "r") as f:
            at = dict(f.attrs)
            for k in ["format", "sampler_position", "rng", "config", "layout", "datasets"]:
                check(isinstance(at[k], bytes), f"attribute {k} is a fixed-length string (bytes in h5py)")
                check(f.attrs.get_id(k).get_type().is_variable_str() is False, f"attribute {k} not variable-length")
            at = {k: (as_text(v) if isinstance(v, bytes) else v) for k, v in at.items()}
            check(at["format"] == "nsatron-checkpoint", f"format {at['format']!r}")
            check(int(at["format_version"]) == 1, "format_version")
            check(int(at["step"]) == 100 and int(at["consumed_tokens"]) == 100 * 4096, "step, tokens")
            check(int(at["optimizer_step"]) == 99, "optimizer_step")
            check(at["sampler_position"].startswith("nsatron-sampler/1 consumed_samples=200 "), "sampler_position")
            check(at["rng"] == "splitmix64 state=3133700", f"rng {at['rng']!r}")
            check("[model]" in at["config"] and "[checkpoint]" in at["config"], "config text")
            check(int(at["rank"]) == 0 and int(at["num_files"]) == 1, "rank, num_files")
            check(at["layout"] == "tp=1 pp=1 dp=1", "layout")
            check(at["extra.lr_schedule"] == "cosine", "extra attribute")
            manifest = at["datasets"].split("\n")
            names = [n for n, _ in PARAMS]
            expected = names + ["optim/m/" + n for n in names] + ["optim/v/" + n for n in names]
            check(manifest == expected, f"manifest {manifest}")
            check(int(at["state_crc32"]) == zlib.crc32(digest_text(at, manifest).encode()), "state_crc32")
            found = []
            f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) else None)
            check(sorted(found) == sorted(expected), f"datasets in the file {sorted(found)}")
            check(isinstance(f["model/layers.0/attn"], h5py.Group), "groups from the slashes")

            raw = open(path, "rb").read()
            flat = {"": [], "optim/m/": [], "optim/v/": []}
            for prefix in flat:
                for name, shape in PARAMS:
                    ds = f[prefix + name]
                    check(ds.dtype == np.dtype("<f4"), f"{ds.name} dtype {ds.dtype}")
                    check(ds.shape == shape, f"{ds.name} shape {ds.shape}")
                    check(ds.chunks is None and ds.compression is None, f"{ds.name} contiguous")
                    check(list(ds.attrs["global_shape"]) == list(shape), f"{ds.name} global_shape")
                    check(list(ds.attrs["offset"]) == [0] * len(shape), f"{ds.name} offset")
                    data = ds[()]
                    crc = zlib.crc32(data.astype("<f4").tobytes())
                    check(int(ds.attrs["crc32"]) == crc, f"{ds.name} crc32 {int(ds.attrs['crc32']):#x} vs {crc:#x}")
                    off = ds.id.get_offset()
                    check(raw[off:off + data.nbytes] == data.tobytes(), f"{ds.name} raw bytes at {off}")
                    check(zlib.crc32(raw[off:off + data.nbytes]) == crc, f"{ds.name} crc of the raw bytes")
                    flat[prefix].append(data.reshape(-1))
            i = np.arange(sum(int(np.prod(s)) for _, s in PARAMS))
            w, m, v = (np.concatenate(flat[p]) for p in ["", "optim/m/", "optim/v/"])
            check(np.array_equal(w, ((i % 97) / 8 - 6).astype(np.float32)), "weights")
            check(np.array_equal(m, (i / 1024).astype(np.float32)), "first moments")
            check(np.array_equal(v, (i % 7).astype(np.float32)), "second moments")
            emb_norm = float(np.sqrt(np.sum(f["model/embedding"][()].astype(np.float64) ** 2)))

        code, text = run([a.tool, "verify", run_dir])
        check(code == 0 and "ok: " in text, f"verify of the good checkpoint: {code} {text}")
        code, text = run([a.tool, "inspect", run_dir])
        check(code == 0 and f"{emb_norm:.6g}" in text, f"inspect shows the embedding norm {emb_norm:.6g}: {text}")

        # Damage copies with h5py: the tools must name what is wrong.
        bad = os.path.join(tmp, "deleted")
        shutil.copytree(run_dir, bad)
        with h5py.File(os.path.join(bad, "step_00000100", "rank_00000.h5"), "r+") as f:
            del f["optim/v/model/final_norm"]
        code, text = run([a.tool, "verify", bad])
        check(code == 1 and "optim/v/model/final_norm: dataset is missing" in text, f"deleted dataset: {code} {text}")

        flipped = os.path.join(tmp, "flipped")
        shutil.copytree(run_dir, flipped)
        fp = os.path.join(flipped, "step_00000100", "rank_00000.h5")
        with h5py.File(fp, "r") as f:
            off = f["model/layers.0/attn/wqkv"].id.get_offset()
        with open(fp, "r+b") as fh:
            fh.seek(off + 21)
            b = fh.read(1)
            fh.seek(off + 21)
            fh.write(bytes([b[0] ^ 0x40]))
        code, text = run([a.tool, "verify", flipped])
        check(code == 1 and "model/layers.0/attn/wqkv: checksum mismatch" in text, f"flipped byte: {code} {text}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("h5py layout checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
