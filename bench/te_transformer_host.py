#!/usr/bin/env python3
"""Host time per call of TransformerEngine's TransformerLayer and DotProductAttention at the host
shapes of bench/attention_bench.lua (B 1, T 128, H 4, D 64, causal, bf16; a layer of hidden 256,
ffn 1024), beside a PyTorch block composed by hand (LayerNorm, Linear QKV, SDPA, projection,
LayerNorm, GELU MLP, residuals) - the anchors of attention_bench's host table. Method as
attention_bench's and TE's own overhead script: a warm-up batch, then --batches batches of
--calls calls between two synchronizations, host wall time of the loop divided by the calls, the
median. "forward + backward" is a forward and the backward of its output with a fixed gradient.
Without transformer_engine installed the TE rows say so and the PyTorch rows still run.

Usage (on the GPU machine): python3 bench/te_transformer_host.py [--calls 20] [--batches 15]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_torch import host_median  # the same method as the SDPA rows

# TransformerEngine is imported before any CUDA work: once PyTorch has run a cuDNN op (the SDPA
# of the PyTorch block) with the cuDNN of its wheel, TE's loader would add the system's cuDNN
# beside it and fail on a symbol of the other version (seen on the GPU machine's image).
try:
    import transformer_engine.pytorch as te
except ImportError as e:
    te, TE_MISSING = None, e

B, T, H, D = 1, 128, 4, 64
HIDDEN, FFN = 256, 1024


class Block(nn.Module):
    """the pre-norm block of bench/gpt_torch.py at HIDDEN, with H heads"""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def rows_of(name, module, args, dout, calls, batches):
    def fwd():
        module(*args)

    def fwd_bwd():
        module(*args).backward(dout)

    for call, fn in (("forward", fwd), ("forward + backward", fwd_bwd)):
        print(f"| {name} | {call} | {host_median(fn, calls, batches) * 1e6:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--batches", type=int, default=15)
    a = p.parse_args()
    dev, bf16 = "cuda", torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(B, T, HIDDEN, device=dev, dtype=bf16, requires_grad=True)
    dx = torch.randn(B, T, HIDDEN, device=dev, dtype=bf16)
    print(f"# host us per call, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| module | call | host us |")
    print("|---|---|---:|")
    rows_of(f"PyTorch block by hand (hidden {HIDDEN}, ffn {FFN}, H {H}, B {B}, T {T})",
            Block().to(dev, bf16), (x,), dx, a.calls, a.batches)
    if te is None:
        print(f"| TransformerEngine | - | not installed ({TE_MISSING}) |")
        return
    layer = te.TransformerLayer(HIDDEN, FFN, H, layernorm_epsilon=1e-5, hidden_dropout=0.0,
                                attention_dropout=0.0, self_attn_mask_type="causal",
                                attn_input_format="bshd", params_dtype=bf16, activation="gelu")
    rows_of(f"te.TransformerLayer (hidden {HIDDEN}, ffn {FFN}, H {H}, B {B}, T {T})",
            layer.to(dev), (x,), dx, a.calls, a.batches)
    q, k, v = (torch.randn(B, T, H, D, device=dev, dtype=bf16, requires_grad=True)
               for _ in range(3))
    dpa = te.DotProductAttention(H, D, attn_mask_type="causal", qkv_format="bshd",
                                 attention_dropout=0.0)
    rows_of(f"te.DotProductAttention (H {H}, D {D}, causal, B {B}, T {T})", dpa, (q, k, v),
            torch.randn(B, T, H * D, device=dev, dtype=bf16), a.calls, a.batches)


if __name__ == "__main__":
    main()
