#!/usr/bin/env python3
"""PyTorch's host time per call for the work of bench/host_overhead.lua, on the same GPU, with
the same shapes and the same method. Part of bench/host_suite.sh; on its own:

    python3 bench/torch_overhead.py [--batch 64] [--in 64] [--out 64] [--hidden 128] [--batches 15]

Method: per figure one warm-up batch, then 15 batches of `calls` calls, torch.cuda.synchronize()
before each batch so the queue starts empty; the host wall time (time.perf_counter) of the
batch's loop divided by calls; the median over the batches. Printed as machine-readable lines

    torch <name> <median us/call> min=<us> max=<us> calls=<n> span=<us>  # what it is

(span: us per call until the GPU has finished too) and '#' lines. The figures:
    autocast        with torch.autocast("cuda", dtype=torch.bfloat16): pass
    linear_fwd      nn.Linear(in, out, bias=False), BF16, forward with autograd on
    linear_fwd_nograd  F.linear under torch.no_grad()
    linear_fwdbwd   forward + backward (grads set to None first, so nothing accumulates)
    fp8_linear      eager per-tensor FP8 linear, current scaling: amax, scale, cast of x and W,
                    torch._scaled_mm (E4M3, BF16 out, fast accumulation)
    ln_linear_fwd, ln_linear_fwdbwd  F.layer_norm + nn.Linear(in, out, bias=False), BF16
    ln_mlp_fwd, ln_mlp_fwdbwd        F.layer_norm + Linear(in, hidden) + GELU(tanh) + Linear(hidden,
                    in), biases, BF16 (the work of lutra's LayerNormMLP)
    adamw_step      AdamW(fused=True).step() over the MLP's 8 tensors
    mlp_step        4-layer MLP (in-hidden-hidden-hidden-out, GELU, biases), BF16 params:
                    zero_grad(set_to_none), forward, MSE loss, backward, AdamW(fused=True) step
    mlp_step_amp    the same with f32 params under torch.autocast(bf16)
    mlp_step_fp8    the same MLP with FP8 Linears written the eager way (a torch.autograd.Function
                    per Linear: per-tensor current scaling of x, W (E4M3) and dy (E5M2), the
                    three GEMMs through torch._scaled_mm, the bias gradient as dy.sum(0), no
                    input gradient for the data), BF16 params, AdamW(fused=True): PyTorch doing
                    the FP8 work of lutra's FP8 step (lutra uses delayed scaling, which needs no
                    amax pass before a cast, so it issues less)
Without PyTorch or without a CUDA device it prints why on a '#' line and exits with 0.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--in", dest="inf", type=int, default=64)
    ap.add_argument("--out", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batches", type=int, default=15)
    args = ap.parse_args()

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        print(f"# torch_overhead: skipped: PyTorch is not installed ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"# torch_overhead: skipped: torch {torch.__version__} sees no CUDA device")
        return 0

    dev, bf16 = "cuda", torch.bfloat16
    M, K, N, H = args.batch, args.inf, args.out, args.hidden
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, Python "
          f"{sys.version.split()[0]}; shapes batch={M} in={K} out={N} hidden={H}; median of "
          f"{args.batches} batches after a warm-up batch")
    sync = torch.cuda.synchronize

    def bench(name, what, calls, fn):
        for _ in range(calls):  # warm-up batch
            fn()
        sync()
        us, span = [], []
        for _ in range(args.batches):
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            us.append((t1 - t0) / calls * 1e6)
            span.append((t2 - t0) / calls * 1e6)
        us.sort()
        span.sort()
        mid = len(us) // 2  # the same middle element as host_floors.cu and host_overhead.lua
        print(f"torch {name} {us[mid]:.4f} min={us[0]:.4f} max={us[-1]:.4f} calls={calls} "
              f"span={span[mid]:.4f}  # {what}", flush=True)

    def attempt(name, what, calls, fn):
        try:
            fn()  # fails here, before timing, if this torch or GPU cannot run it
            sync()
        except Exception as e:  # noqa: BLE001 - report any failure and go on
            print(f"# {name}: n/a: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return
        bench(name, what, calls, fn)

    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=bf16)
    dy = torch.randn(M, N, device=dev, dtype=bf16)

    def autocast():
        with torch.autocast("cuda", dtype=bf16):
            pass

    attempt("autocast", "torch.autocast('cuda', bf16) enter+exit", 20000, autocast)

    lin = nn.Linear(K, N, bias=False, device=dev, dtype=bf16)
    attempt("linear_fwd", "nn.Linear BF16 forward, autograd on", 500, lambda: lin(x))
    w = lin.weight.detach()

    with torch.no_grad():
        attempt("linear_fwd_nograd", "F.linear BF16 under torch.no_grad()", 500,
                lambda: F.linear(x, w))

    xg = x.clone().requires_grad_(True)

    def linear_fwdbwd():
        lin.weight.grad = None
        xg.grad = None
        lin(xg).backward(dy)

    attempt("linear_fwdbwd", "nn.Linear BF16 forward + backward", 200, linear_fwdbwd)

    # the norm-fused modules' work, eager: F.layer_norm + Linear (+ tanh GELU + Linear), BF16,
    # autograd on (lutra's LayerNormLinear / LayerNormMLP figures)
    ln_w = torch.ones(K, device=dev, dtype=bf16, requires_grad=True)
    ln_b = torch.zeros(K, device=dev, dtype=bf16, requires_grad=True)
    fc1 = nn.Linear(K, H, device=dev, dtype=bf16)
    fc2 = nn.Linear(H, K, device=dev, dtype=bf16)
    dyk = torch.randn(M, K, device=dev, dtype=bf16)

    def ln_linear():
        return lin(F.layer_norm(xg, (K,), ln_w, ln_b))

    def ln_mlp():
        return fc2(F.gelu(fc1(F.layer_norm(xg, (K,), ln_w, ln_b)), approximate="tanh"))

    def clear(*mods):
        for t in (xg, ln_w, ln_b):
            t.grad = None
        for m in mods:
            for p in m.parameters():
                p.grad = None

    attempt("ln_linear_fwd", "F.layer_norm + nn.Linear BF16 forward, autograd on", 500, ln_linear)
    attempt("ln_linear_fwdbwd", "F.layer_norm + nn.Linear BF16 forward + backward", 200,
            lambda: (clear(lin), ln_linear().backward(dy)))
    attempt("ln_mlp_fwd", "F.layer_norm + Linear + GELU(tanh) + Linear BF16 forward", 500, ln_mlp)
    attempt("ln_mlp_fwdbwd", "F.layer_norm + Linear + GELU(tanh) + Linear BF16 fwd + bwd", 200,
            lambda: (clear(fc1, fc2), ln_mlp().backward(dyk)))

    e4m3 = getattr(torch, "float8_e4m3fn", None)
    fmax = torch.finfo(e4m3).max if e4m3 is not None else 448.0

    def fp8_linear():
        sx = fmax / x.abs().amax().float().clamp(min=1e-12)
        sw = fmax / w.abs().amax().float().clamp(min=1e-12)
        xq = (x * sx).to(e4m3)
        wq = (w * sw).to(e4m3)
        return torch._scaled_mm(xq, wq.t(), scale_a=sx.reciprocal(), scale_b=sw.reciprocal(),
                                out_dtype=bf16, use_fast_accum=True)

    attempt("fp8_linear", "eager per-tensor FP8 linear: amax, scale, cast, torch._scaled_mm",
            200, fp8_linear)

    def mlp(dtype):
        return nn.Sequential(nn.Linear(K, H), nn.GELU(approximate="tanh"), nn.Linear(H, H),
                             nn.GELU(approximate="tanh"), nn.Linear(H, H),
                             nn.GELU(approximate="tanh"), nn.Linear(H, N)).to(dev, dtype)

    def adamw(params):
        params = list(params)
        try:
            return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)

    target = torch.randn(M, N, device=dev, dtype=bf16)
    net = mlp(bf16)
    opt = adamw(net.parameters())
    fused = bool(opt.defaults.get("fused"))

    def mlp_step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(net(x), target).backward()
        opt.step()

    attempt("mlp_step", f"4-layer MLP step, BF16 params, AdamW(fused={fused})", 50, mlp_step)
    # the last step left gradients in place for the optimizer alone
    attempt("adamw_step", f"AdamW(fused={fused}) step over the MLP's 8 tensors", 200, opt.step)

    net32 = mlp(torch.float32)
    opt32 = adamw(net32.parameters())
    x32, target32 = x.float(), target.float()

    def mlp_step_amp():
        opt32.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=bf16):
            loss = F.mse_loss(net32(x32), target32)
        loss.backward()
        opt32.step()

    attempt("mlp_step_amp", "4-layer MLP step, f32 params + autocast(bf16)", 50, mlp_step_amp)

    e5m2 = getattr(torch, "float8_e5m2", None)
    if e4m3 is None or e5m2 is None or not hasattr(torch, "_scaled_mm"):
        print("# torch_overhead: mlp_step_fp8 skipped: no float8 dtypes or torch._scaled_mm")
        return 0
    fmax5 = torch.finfo(e5m2).max

    def quantize(t, dtype, top):
        scale = top / t.abs().amax().float().clamp(min=1e-12)
        return (t * scale).to(dtype), scale.reciprocal()

    def col_major(t):  # _scaled_mm's second operand is column-major
        return t.t().contiguous().t()

    class FP8LinearFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xq, sx = quantize(x, e4m3, fmax)
            wq, sw = quantize(w, e4m3, fmax)
            ctx.save_for_backward(xq, sx, wq, sw)
            return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, bias=b, out_dtype=bf16,
                                    use_fast_accum=True)

        @staticmethod
        def backward(ctx, dy):
            xq, sx, wq, sw = ctx.saved_tensors
            gq, sg = quantize(dy.contiguous(), e5m2, fmax5)
            dx = None
            if ctx.needs_input_grad[0]:
                dx = torch._scaled_mm(gq, col_major(wq), scale_a=sg, scale_b=sw, out_dtype=bf16)
            dw = torch._scaled_mm(gq.t().contiguous(), col_major(xq), scale_a=sg, scale_b=sx,
                                  out_dtype=bf16)
            return dx, dw, dy.sum(0)

    class FP8Linear(nn.Linear):
        def forward(self, inp):
            return FP8LinearFn.apply(inp, self.weight, self.bias)

    gelu = lambda: nn.GELU(approximate="tanh")  # noqa: E731
    net8 = nn.Sequential(FP8Linear(K, H), gelu(), FP8Linear(H, H), gelu(), FP8Linear(H, H), gelu(),
                         FP8Linear(H, N)).to(dev, bf16)
    opt8 = adamw(net8.parameters())

    def mlp_step_fp8():
        opt8.zero_grad(set_to_none=True)
        F.mse_loss(net8(x), target).backward()
        opt8.step()

    attempt("mlp_step_fp8", f"4-layer MLP step, FP8 Linears (eager per-tensor current scaling, "
            f"torch._scaled_mm), BF16 params, AdamW(fused={fused})", 50, mlp_step_fp8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
