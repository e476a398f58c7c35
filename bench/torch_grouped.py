#!/usr/bin/env python3
"""PyTorch at GroupedLinear's benchmark shapes (bench/grouped_bench.lua), on the same machine.

host: host time per call of an 8- and 64-expert grouped linear (16 rows per expert, 64 -> 64,
      bf16), splits changing every call:
      - loop      x.split(m_splits) + one F.linear per expert + torch.cat (the splits a host
                  list: what TransformerEngine's m_splits.tolist() gives), forward and
                  forward+backward
      - grouped   torch._grouped_mm(x, W^T, offs=cumsum(splits)) with the offsets on the
                  device (no host sync), where this torch has it
      - scaled    torch._scaled_grouped_mm with E4M3 operands and rowwise scales, where present
gemm: GPU throughput of torch._grouped_mm at tokens 16384, 4096 -> 4096 and 1024 -> 4096, 8 and
      64 experts, balanced and skewed, next to one dense torch.matmul of the same FLOPs.
Method: as bench/torch_overhead.py (warm-up, 15 batches of `calls` calls after a synchronize,
median of the per-call host time). Usage: python3 bench/torch_grouped.py [--quick]
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

QUICK = "--quick" in sys.argv
BATCHES, CALLS = (3, 20) if QUICK else (15, 100)
dev = torch.device("cuda")


def host_time(fn):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(BATCHES):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        ts.append((time.perf_counter() - t0) / CALLS)
    return statistics.median(ts)


def splits_ring(E, T, n=16, skew=False):
    g = torch.Generator().manual_seed(E)
    out = []
    for _ in range(n):
        if skew:
            s = [T // 2] + [0] * (E - 1)
            rest = T - T // 2
            for e in range(1, E):
                s[e] = rest // (E - 1)
            s[-1] += T - sum(s)
        else:
            w = torch.rand(E, generator=g) + 0.5
            s = (w / w.sum() * T).floor().long().tolist()
            s[-1] += T - sum(s)
        out.append(s)
    return out


def host_part():
    print("## PyTorch host time per call (bf16, 16 rows per expert, 64 -> 64)")
    print("| experts | variant | call | us |")
    print("|---|---|---|---|")
    K = N = 64
    for E in (8, 64):
        T = 16 * E
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
              for _ in range(E)]
        bs = [torch.zeros(N, device=dev, dtype=torch.bfloat16, requires_grad=True)
              for _ in range(E)]
        ring = splits_ring(E, T)
        dev_ring = [torch.tensor(s, device=dev, dtype=torch.int32) for s in ring]
        i = [0]

        def loop_fwd():
            i[0] = (i[0] + 1) % len(ring)
            parts = x.split(ring[i[0]])
            return torch.cat([F.linear(p, w, b) for p, w, b in zip(parts, ws, bs)])

        def loop_step():
            loop_fwd().backward(torch.ones(T, N, device=dev, dtype=torch.bfloat16))

        print(f"| {E} | F.linear loop | forward | {host_time(loop_fwd) * 1e6:.1f} |")
        print(f"| {E} | F.linear loop | forward+backward | {host_time(loop_step) * 1e6:.1f} |")
        if hasattr(torch, "_grouped_mm"):
            W = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16, requires_grad=True)

            def gmm_fwd():
                i[0] = (i[0] + 1) % len(ring)
                offs = torch.cumsum(dev_ring[i[0]], 0, dtype=torch.int32)
                return torch._grouped_mm(x, W.transpose(-2, -1), offs=offs)

            try:
                print(f"| {E} | torch._grouped_mm | forward | {host_time(gmm_fwd) * 1e6:.1f} |")
            except RuntimeError as e:
                print(f"| {E} | torch._grouped_mm | forward | n/a ({str(e).splitlines()[0]}) |")
        else:
            print(f"| {E} | torch._grouped_mm | forward | n/a (not in torch {torch.__version__}) |")
        if hasattr(torch, "_scaled_grouped_mm"):
            xq = x.detach().to(torch.float8_e4m3fn)
            Wq = torch.randn(E, N, K, device=dev).to(torch.float8_e4m3fn)
            sa = torch.ones(T, device=dev, dtype=torch.float32)
            sb = torch.ones(E, N, device=dev, dtype=torch.float32)

            def sgmm_fwd():
                i[0] = (i[0] + 1) % len(ring)
                offs = torch.cumsum(dev_ring[i[0]], 0, dtype=torch.int32)
                return torch._scaled_grouped_mm(xq, Wq.transpose(-2, -1), sa, sb, offs=offs,
                                                out_dtype=torch.bfloat16)

            try:
                print(f"| {E} | torch._scaled_grouped_mm | forward | "
                      f"{host_time(sgmm_fwd) * 1e6:.1f} |")
            except RuntimeError as e:
                print(f"| {E} | torch._scaled_grouped_mm | forward | n/a "
                      f"({str(e).splitlines()[0]}) |")


def gpu_time(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def gemm_part():
    if not hasattr(torch, "_grouped_mm"):
        print(f"\ntorch._grouped_mm is not in torch {torch.__version__}: no GEMM figures")
        return
    T = 16384
    print("\n## torch._grouped_mm throughput (bf16, tokens 16384)")
    print("| experts | in -> out | routing | grouped TFLOP/s | dense TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|")
    for K, N in ((4096, 4096), (1024, 4096)):
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        Wd = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        td = gpu_time(lambda: x @ Wd)
        for E in (8, 64):
            W = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16)
            for skew in (False, True):
                s = splits_ring(E, T, 1, skew)[0]
                offs = torch.cumsum(torch.tensor(s, device=dev, dtype=torch.int32), 0,
                                    dtype=torch.int32)
                try:
                    tg = gpu_time(lambda: torch._grouped_mm(x, W.transpose(-2, -1), offs=offs))
                except RuntimeError as e:
                    print(f"| {E} | {K} -> {N} | {'skewed' if skew else 'balanced'} | n/a "
                          f"({str(e).splitlines()[0]}) | | |")
                    continue
                fl = 2 * T * K * N
                print(f"| {E} | {K} -> {N} | {'skewed' if skew else 'balanced'} | "
                      f"{fl / tg / 1e12:.0f} | {fl / td / 1e12:.0f} | {td / tg:.2f} |")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    host_part()
    gemm_part()
