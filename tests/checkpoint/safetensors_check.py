#!/usr/bin/env python3
"""Python side of the safetensors round trip (see test_safetensors.cpp), with
the reference implementation: the `safetensors` package (pip) and numpy.

  safetensors_check.py check   DIR   # C++ wrote model*.safetensors: check them, write python*.safetensors
  safetensors_check.py compare DIR   # C++ re-exported python*.safetensors: equal to what we wrote

check: names, shapes and dtypes equal the model's (reference.json), f32 values
bitwise equal the master (reference.f32), bf16 values equal the master rounded
to nearest even, the header is 8-byte aligned and has kshard's metadata.
"""
import json
import os
import struct
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def reference(d):
    index = json.load(open(os.path.join(d, "reference.json")))
    raw = np.fromfile(os.path.join(d, "reference.f32"), dtype="<f4")
    out = {}
    for e in index:
        n = int(np.prod(e["shape"])) if e["shape"] else 1
        out[e["name"]] = raw[e["offset"]:e["offset"] + n].reshape(e["shape"])
    return index, out


def bf16_rne(x):
    """f32 -> bf16 bits (round to nearest even), as uint16."""
    u = x.astype("<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def bf16_bits_from_file(path, name):
    """The raw bf16 bits of a tensor (numpy has no bf16): header offsets."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        b, e = header[name]["data_offsets"]
        f.seek(8 + n + b)
        return np.frombuffer(f.read(e - b), dtype="<u2"), header[name]


def check(d):
    index, ref = reference(d)
    path = os.path.join(d, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    if (8 + n) % 8:
        fail(f"data section of {path} starts at {8 + n}, not 8-byte aligned")
    with safe_open(path, framework="np") as f:
        meta = f.metadata()
        if meta.get("kshard.format") != "kshard-safetensors-1" or "kshard.layers" not in meta:
            fail(f"metadata of {path}: {meta}")
    t = load_file(path)
    if sorted(t) != sorted(ref):
        fail(f"names differ: {sorted(set(t) ^ set(ref))}")
    for name, want in ref.items():
        got = t[name]
        if got.dtype != np.float32 or got.shape != want.shape:
            fail(f"{name}: {got.dtype} {got.shape}, expected float32 {want.shape}")
        if got.tobytes() != want.tobytes():
            fail(f"{name}: values differ from the master")
    # Layouts the docs state: Linear weight [out, in], qkv packed [3d, d] (q, k, v rows).
    d_model = ref["layers.1.ln1.gamma"].shape[0]
    vocab = ref["layers.0.weight"].shape[0]
    expect = {"layers.1.attn.qkv.weight": (3 * d_model, d_model), "layers.1.mlp.fc1.weight": (4 * d_model, d_model),
              "layers.1.mlp.fc2.weight": (d_model, 4 * d_model), "layers.3.weight": (vocab, d_model)}
    for name, shape in expect.items():
        if t[name].shape != shape:
            fail(f"{name} has shape {t[name].shape}, docs say {shape}")
    bpath = os.path.join(d, "model.bf16.safetensors")
    for name, want in ref.items():
        bits, h = bf16_bits_from_file(bpath, name)
        if h["dtype"] != "BF16" or tuple(h["shape"]) != want.shape:
            fail(f"{bpath}: {name} is {h}")
        if not np.array_equal(bits, bf16_rne(want).reshape(-1)):
            fail(f"{bpath}: {name} is not the master rounded to nearest even")
    with safe_open(bpath, framework="np") as f:  # the reference reader accepts it too
        if sorted(f.keys()) != sorted(ref):
            fail(f"{bpath}: keys")
    print(f"check: {len(ref)} tensors of {path} and {bpath} as the model holds them")

    # Python writes; C++ reads back (different values, its own file layout).
    mine = {k: (v * np.float32(0.5) + np.float32(0.25)).astype(np.float32) for k, v in ref.items()}
    save_file(mine, os.path.join(d, "python.safetensors"), metadata={"writer": "python"})
    save_file({k: v.astype(np.float16) for k, v in ref.items()}, os.path.join(d, "python_f16.safetensors"))
    print("check: wrote python.safetensors (f32) and python_f16.safetensors (f16)")


def compare(d):
    for src, back in (("python", "roundtrip_python"), ("python_f16", "roundtrip_python_f16")):
        a = load_file(os.path.join(d, src + ".safetensors"))
        b = load_file(os.path.join(d, back + ".safetensors"))
        if sorted(a) != sorted(b):
            fail(f"{back}: names differ")
        for k in a:
            want = a[k].astype(np.float32)  # f16 -> f32 is exact
            if b[k].dtype != np.float32 or b[k].shape != want.shape or b[k].tobytes() != want.tobytes():
                fail(f"{back}: {k} differs from what Python wrote")
        print(f"compare: {back}.safetensors equals {src}.safetensors ({len(a)} tensors)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "compare"):
        print(__doc__)
        sys.exit(2)
    (check if sys.argv[1] == "check" else compare)(sys.argv[2])
