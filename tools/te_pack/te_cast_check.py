#!/usr/bin/env python3
"""Check TE's fused LayerNorm + FP8 casts on the GPU: do the kernels write sensible codes?

  PYTHONPATH=/tmp/site python3 tools/te_pack/te_cast_check.py [--rows 16384 --cols 4096] [--small]

For bf16 x [rows, cols] and a LayerNorm with random gamma/beta, calls
transformer_engine_torch.layernorm_fwd(x, gamma, beta, eps, None, quantizer, otype, 0, False)
(as transformer_engine/pytorch/module/_common.py's apply_normalization does) with each quantizer,
rowwise and columnwise usage both on, and prints one markdown table: per output (rowwise codes,
columnwise codes), the share of nonzero codes whose sign bit matches the sign of torch's fp32
LayerNorm, the share of nonzero codes, the NMSE of the dequantized tensor against that
reference, and the call's median time (CUDA events, 20 calls). A cast that works gives sign
agreement ~1.0; a kernel that writes nothing gives ~0.5 or all zeros. A quantizer that fails
prints its error in its row.
"""
import argparse
import sys
import traceback

import torch  # before transformer_engine: TE's core library needs the CUDA libraries torch loads
import transformer_engine.pytorch  # noqa: F401  (loads transformer_engine_torch)
import transformer_engine_torch as tex
from transformer_engine.pytorch.quantized_tensor import QuantizedTensorStorage
from transformer_engine.pytorch.tensor.float8_tensor import (
    Float8Quantizer, Float8CurrentScalingQuantizer)
from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

E4M3 = tex.DType.kFloat8E4M3
EPS = 1e-5


def quantizers(ref):
    amax = ref.abs().max().float()
    scale = (448.0 / amax).reshape(1)  # the delayed-scaling scale a previous step would give
    dev = ref.device
    return [
        ("none (bf16 out)", lambda: None),
        ("Float8Quantizer (delayed, per-tensor)",
         lambda: Float8Quantizer(scale.clone(), torch.zeros(1, device=dev), E4M3,
                                 rowwise=True, columnwise=True)),
        ("Float8CurrentScalingQuantizer",
         lambda: Float8CurrentScalingQuantizer(E4M3, dev, rowwise=True, columnwise=True)),
        ("MXFP8Quantizer (1x32 E8M0)",
         lambda: MXFP8Quantizer(E4M3, rowwise=True, columnwise=True)),
        ("Float8BlockQuantizer 1x128",
         lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)),
        ("Float8BlockQuantizer 128x128",
         lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)),
    ]


def code_stats(codes, ref):
    """codes: uint8 FP8 codes laid out like ref (or like ref.T: picked by shape)."""
    if codes is None:
        return "-", "-"
    codes = codes.view(torch.uint8)
    if tuple(codes.shape) != tuple(ref.shape):
        if tuple(codes.shape) == tuple(ref.t().shape):
            ref = ref.t()
        else:
            return f"shape {tuple(codes.shape)}?", "-"
    nonzero = (codes & 0x7F) != 0
    neg_code = (codes & 0x80) != 0
    match = (neg_code == (ref < 0)) & nonzero & (ref != 0)
    denom = (nonzero & (ref != 0)).sum().item()
    agree = match.sum().item() / denom if denom else float("nan")
    return f"{agree:.4f}", f"{nonzero.float().mean().item():.4f}"


def outputs(out):
    """(rowwise codes, columnwise codes) of TE's quantized tensor types."""
    for row, col in (("_data", "_transpose"), ("_rowwise_data", "_columnwise_data")):
        if hasattr(out, row) or hasattr(out, col):
            return getattr(out, row, None), getattr(out, col, None)
    return None, None


def nmse(out, ref):
    deq = out.dequantize(dtype=torch.float32) if isinstance(out, QuantizedTensorStorage) \
        else out.float()
    deq = deq.reshape(ref.shape)
    return ((deq - ref).pow(2).sum() / ref.pow(2).sum()).item()


def time_call(fn, iters):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--small", action="store_true", help="rows=1024, cols=2048")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows, cols = (1024, 2048) if args.small else (args.rows, args.cols)
    assert rows != cols and rows % 128 == 0 and cols % 128 == 0, \
        "rows, cols: multiples of 128, and unequal (columnwise codes are told apart by shape)"
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    x = (torch.randn(rows, cols, device=dev) * 2 + 0.5).to(torch.bfloat16)
    gamma = (torch.rand(cols, device=dev) * 1.5 + 0.25).to(torch.bfloat16)
    beta = (torch.randn(cols, device=dev) * 0.5).to(torch.bfloat16)
    ref = torch.nn.functional.layer_norm(x.float(), (cols,), gamma.float(), beta.float(), EPS)

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, x bf16 [{rows}, {cols}]\n")
    print("| quantizer | rowwise sign agree | rowwise nonzero | columnwise sign agree "
          "| columnwise nonzero | NMSE (dequantized) | median ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, make in quantizers(ref):
        cells = ["-"] * 6 + [""]
        try:
            q = make()
            otype = tex.DType.kBFloat16

            def call():
                return tex.layernorm_fwd(x, gamma, beta, EPS, None, q, otype, 0, False)

            out = call()[0]
            torch.cuda.synchronize()
            if q is None:
                cells[4] = f"{nmse(out, ref):.3e}"
            else:
                rw, cw = outputs(out)
                cells[0], cells[1] = code_stats(rw, ref)
                cells[2], cells[3] = code_stats(cw, ref)
                try:
                    cells[4] = f"{nmse(out, ref):.3e}"
                except Exception as e:  # noqa: BLE001
                    cells[4] = f"n/a ({type(e).__name__})"
            cells[5] = f"{time_call(call, args.iters):.3f}"
        except Exception as e:  # noqa: BLE001
            msg = str(e).strip().splitlines()
            cells[6] = f"{type(e).__name__}: {msg[0][:160] if msg else ''}"
            traceback.print_exc(limit=2, file=sys.stderr)
        print(f"| {name} | " + " | ".join(c.replace("|", "/") for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
