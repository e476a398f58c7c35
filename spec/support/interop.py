# spec/checkpoint_python_spec.lua's Python side, with the PyPI packages safetensors and numpy:
#   python3 interop.py read LUTRA_FILE OUT_DIR    checks the file with safetensors and writes
#       every F32/I64/U64 tensor's raw bytes to OUT_DIR/NAME.bin, and a listing NAME DTYPE SHAPE
#       of all tensors (BF16 ones too, which numpy cannot hold: checked through safe_open)
#   python3 interop.py write OUT_FILE REF_DIR SEED  writes a torch-style state dict (fc1/fc2
#       names, fc1 F32, fc2 F16, an _extra_state U8 tensor, {"format": "pt"}) and, for the spec
#       to compare against, the values as f32 (REF_DIR/NAME.f32) and rounded to bf16 by
#       round-to-nearest-even (REF_DIR/NAME.bf16)
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def read(path, out_dir):
    meta = safe_open(path, framework="np").metadata()
    print("meta format=%s version=%s" % (meta.get("format"), meta.get("version")))
    with safe_open(path, framework="np") as f:
        for name in sorted(f.keys()):
            s = f.get_slice(name)
            print("tensor %s %s %s" % (name, s.get_dtype(), ",".join(map(str, s.get_shape()))))
            if s.get_dtype() in ("F32", "I64", "U64"):
                f.get_tensor(name).tofile(os.path.join(out_dir, name + ".bin"))


def bf16_rne(x):
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write(path, ref_dir, seed):
    rng = np.random.default_rng(int(seed))
    tensors = {
        "fc1.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "fc1.bias": rng.standard_normal(64).astype(np.float32),
        "fc2.weight": rng.standard_normal((16, 64)).astype(np.float16),
        "fc2.bias": rng.standard_normal(16).astype(np.float16),
        "fc1._extra_state": np.frombuffer(b"te-fp8-meta", dtype=np.uint8).copy(),
    }
    save_file(tensors, path, metadata={"format": "pt"})
    for name, v in tensors.items():
        if v.dtype == np.uint8:
            continue
        v.astype(np.float32).tofile(os.path.join(ref_dir, name + ".f32"))
        bf16_rne(v.astype(np.float32)).tofile(os.path.join(ref_dir, name + ".bf16"))
    print("written")


if __name__ == "__main__":
    if sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    else:
        write(sys.argv[2], sys.argv[3], sys.argv[4])
