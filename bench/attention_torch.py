#!/usr/bin/env python3
"""PyTorch's torch.nn.functional.scaled_dot_product_attention at bench/attention_bench.lua's
shapes, the anchor of its figures: GPT-2 124M's attention (B 16, T 1024, H 12, D 64) and a
Llama-like layer's (B 2, T 4096, H 32, Hkv 8, D 128), causal, bf16 (--dtype f16).

q, k and v are laid out as lutra's bshd ([B, T, H, D] in memory, handed to PyTorch as the
[B, H, T, D] views it takes), GQA through enable_gqa. Each of PyTorch's backends that takes the
shape is timed alone (torch.nn.attention.sdpa_kernel: cuDNN, Flash, memory-efficient), then the
default choice. Per figure: warm-up calls, then --reps calls each between two CUDA events, the
median. The forward runs under no_grad; the backward is torch.autograd.grad(out, (q, k, v),
dout) of one forward with the graph kept (retain_graph): the backward's kernels alone, nothing
accumulated into .grad. FLOPs as attention_bench.lua counts them: forward 4 B H T^2 D, halved
when causal; backward 2.5 times the forward. Host time per call: the median over batches of
--calls forward calls (and forward + backward) issued between two synchronizations, wall clock
divided by the calls.

Usage (on the GPU machine): python3 bench/attention_torch.py [--dtype bf16|f16] [--reps 20]
[--calls 20] [--batches 15] [--quick]
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [
    ("GPT-2 124M", 16, 1024, 12, 12, 64, True),
    ("Llama-like", 2, 4096, 32, 8, 128, True),
]


def forward_flops(b, t, h, d, causal):
    return 4 * b * h * t * t * d / (2 if causal else 1)


def inputs(b, t, h, hkv, d, dtype):
    """bshd tensors viewed as [B, H, T, D]; q, k, v require grad."""
    def make(heads, seed, grad):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(b, t, heads, d, device="cuda", dtype=dtype, generator=g)
        return x.transpose(1, 2).requires_grad_(grad)
    return make(h, 1, True), make(hkv, 2, True), make(hkv, 3, True), make(h, 4, False)


def event_median(fn, reps, warmups=3):
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def host_median(fn, calls, batches):
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return statistics.median(per_call)


def backends():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    named = [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("Flash", SDPBackend.FLASH_ATTENTION),
             ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION)]
    out = [(name, lambda b=b: sdpa_kernel([b])) for name, b in named]
    out.append(("default", None))
    return out


def run(args):
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    reps = 3 if args.quick else args.reps
    calls, batches = (5, 3) if args.quick else (args.calls, args.batches)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}, {args.dtype}")
    print()
    print("| shape | backend | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd host us "
          "| fwd+bwd host us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, b, t, h, hkv, d, causal in SHAPES:
        q, k, v, dout = inputs(b, t, h, hkv, d, dtype)
        gqa = h != hkv
        flops = forward_flops(b, t, h, d, causal)
        label = f"{name} (B {b}, T {t}, H {h}/{hkv}, D {d}{', causal' if causal else ''})"

        def attend():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        def forward():
            with torch.no_grad():
                attend()

        def step():
            torch.autograd.grad(attend(), (q, k, v), dout)

        for backend, context in backends():
            try:
                with context() if context else contextlib.nullcontext():
                    fwd = event_median(forward, reps)
                    out = attend()
                    bwd = event_median(
                        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps)
                    del out
                    fwd_host = host_median(forward, calls, batches)
                    step_host = host_median(step, calls, batches)
            except RuntimeError as e:  # this backend does not take the shape
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                print(f"| {label} | {backend} | n/a: {first[:80]} | | | | | |")
                continue
            print(f"| {label} | {backend} | {fwd * 1e3:.3f} | {flops / fwd / 1e12:.0f} "
                  f"| {bwd * 1e3:.3f} | {2.5 * flops / bwd / 1e12:.0f} | {fwd_host * 1e6:.1f} "
                  f"| {step_host * 1e6:.1f} |")
        del q, k, v, dout
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--reps", type=int, default=20, help="timed calls per figure")
    p.add_argument("--calls", type=int, default=20, help="calls per host-time batch")
    p.add_argument("--batches", type=int, default=15, help="host-time batches")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    run(p.parse_args())


if __name__ == "__main__":
    main()
