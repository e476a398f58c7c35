#!/usr/bin/env python3
"""PyTorch's side of spec/gpu/torch_parity_gpu.lua: reads the inputs, weights and lutra's outputs
that the spec wrote into a folder, computes the same with PyTorch in float64 on the GPU
(F.scaled_dot_product_attention, and a TransformerLayer composed by hand from torch.nn.functional
with lutra's weights), and prints one line per compared tensor:

    nmse NAME VALUE

NMSE = sum (lutra - torch)^2 / sum torch^2. The spec holds the bounds. Files: manifest.txt (one
line per tensor: name, then its dims), NAME.f32 (raw little-endian float32 in that shape), and
for the layer, layer.safetensors (lutra.save's names) and grads.safetensors (the parameters'
gradients under the same names). Usage: python3 torch_reference.py DIR attention causal|no_mask
or python3 torch_reference.py DIR layer HEADS.
"""
import json
import struct
import sys

import torch
import torch.nn.functional as F


def read_manifest(d):
    shapes = {}
    for line in open(f"{d}/manifest.txt"):
        name, *dims = line.split()
        shapes[name] = [int(x) for x in dims]
    return shapes


def load(d, shapes, name):
    t = torch.from_file(f"{d}/{name}.f32", size=int(torch.tensor(shapes[name]).prod()),
                        dtype=torch.float32)
    return t.view(shapes[name]).to("cuda", torch.float64)


def load_safetensors(path, device="cuda"):
    """{name: float64 tensor on device} of a safetensors file (8 bytes of header length, a JSON
    header, the data), read without the safetensors package."""
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] not in dtypes:
            continue
        a, b = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dtypes[t["dtype"]]) \
            .view(t["shape"]).to(device, torch.float64)
    return out


def nmse(name, got, want):
    e = ((got - want) ** 2).sum() / (want ** 2).sum().clamp_min(1e-300)
    print(f"nmse {name} {e.item():.6e}", flush=True)


def attention(d, shapes, causal):
    q, k, v, dout = (load(d, shapes, n).requires_grad_(n != "dout")
                     for n in ("q", "k", "v", "dout"))
    # lutra's {B, T, H, D} is torch's {B, H, T, D} transposed
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=causal, enable_gqa=True).transpose(1, 2)
    o.backward(dout)
    nmse("out", load(d, shapes, "out"), o.detach())
    for n, t in (("dq", q), ("dk", k), ("dv", v)):
        nmse(n, load(d, shapes, n), t.grad)


def layer(d, shapes, heads):
    w = {k: v.requires_grad_() for k, v in load_safetensors(f"{d}/layer.safetensors").items()}
    x = load(d, shapes, "x").requires_grad_()
    dy = load(d, shapes, "dy")
    a, m = "self_attention.", "layernorm_mlp."
    B, T, hidden = x.shape
    h = F.layer_norm(x, (hidden,), w[a + "layernorm_qkv.norm.weight"],
                     w[a + "layernorm_qkv.norm.bias"], 1e-5)
    qkv = F.linear(h, w[a + "layernorm_qkv.weight"], w[a + "layernorm_qkv.bias"])
    q, k, v = qkv.view(B, T, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
    h1 = x + F.linear(o, w[a + "proj.weight"], w[a + "proj.bias"])
    u = F.layer_norm(h1, (hidden,), w[m + "norm.weight"], w[m + "norm.bias"], 1e-5)
    u = F.gelu(F.linear(u, w[m + "fc1.weight"], w[m + "fc1.bias"]), approximate="tanh")
    y = h1 + F.linear(u, w[m + "fc2.weight"], w[m + "fc2.bias"])
    y.backward(dy)
    nmse("y", load(d, shapes, "y"), y.detach())
    nmse("dx", load(d, shapes, "dx"), x.grad)
    grads = load_safetensors(f"{d}/grads.safetensors")
    for name, t in w.items():
        nmse("grad:" + name, grads[name], t.grad)


def main():
    d, what = sys.argv[1], sys.argv[2]
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = read_manifest(d)
    if what == "attention":
        attention(d, shapes, causal=sys.argv[3] == "causal")
    else:
        layer(d, shapes, heads=int(sys.argv[3]))


if __name__ == "__main__":
    main()
