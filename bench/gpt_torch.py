#!/usr/bin/env python3
"""The PyTorch side of bench/gpt_bench.lua: the same decoder-only GPT, data shapes and optimizer
as examples/train_gpt.lua, timed per training step on one GPU.

Model: token + learned position embedding, pre-norm blocks (LayerNorm, fused QKV with bias,
causal scaled-dot-product attention, output projection, LayerNorm, tanh-GELU MLP 4x), final
LayerNorm, LM head tied to the token embedding, cross-entropy. Optimizer: AdamW (fused), weight
decay 0.1 on 2-D weights only, global-norm gradient clipping at 1.0, a warmup + cosine learning
rate set every step. Tokens: uniform random ids (throughput does not depend on them).

Builds (--builds): eager (BF16 autocast, SDPA), compile (torch.compile), compile-cg
(torch.compile mode="reduce-overhead": CUDA graphs), te / te8 (TransformerEngine's
TransformerLayer in BF16 / FP8 delayed scaling, when transformer_engine imports).
Prints one markdown row per (config, build): ms/step, tokens/s, MFU against the H100/H200 dense
BF16 peak (989 TFLOP/s; FLOPs per token 6 N + 12 L T d, N the non-embedding parameters plus the
head, PaLM's count), peak device memory, and the host time to issue one step (no sync).
Median of --reps batches of --steps steps after --warmup steps.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {"small": dict(V=8192, d=256, L=4, h=4, T=256, B=32),
           "gpt2": dict(V=50304, d=768, L=12, h=12, T=1024, B=16)}
PEAK_TFLOPS = 989.0


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c, te_layers=None):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c["V"], c["d"]), nn.Embedding(c["T"], c["d"])
        self.blocks = nn.ModuleList(te_layers or [Block(c["d"], c["h"]) for _ in range(c["L"])])
        self.lnf = nn.LayerNorm(c["d"])
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.cast = te_layers is not None

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        if self.cast:
            x = x.to(torch.bfloat16)
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


def te_blocks(c, te):
    return [te.TransformerLayer(c["d"], 4 * c["d"], c["h"], layernorm_epsilon=1e-5,
                                hidden_dropout=0.0, attention_dropout=0.0,
                                self_attn_mask_type="causal", attn_input_format="bshd",
                                params_dtype=torch.bfloat16, activation="gelu")
            for _ in range(c["L"])]


def flops_per_token(model, c):
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * c["L"] * c["T"] * c["d"]


def lr_at(step, warmup=100, total=10000, peak=6e-4, floor=6e-5):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * p))


def run(name, c, build, args):
    te = None
    if build in ("te", "te8"):
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipe
    torch.manual_seed(0)
    model = GPT(c, te_blocks(c, te) if te else None).cuda()
    if te:
        model = model.to(torch.bfloat16)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    # a tensor learning rate: changed every step without recompiling or re-capturing
    lr = torch.tensor(lr_at(0), device="cuda")
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                            fused=True, capturable=build == "compile-cg")
    idx = torch.randint(0, c["V"], (c["B"], c["T"]), device="cuda")
    tgt = torch.randint(0, c["V"], (c["B"], c["T"]), device="cuda")
    fwd = model
    if build == "compile":
        fwd = torch.compile(model)
    elif build == "compile-cg":
        fwd = torch.compile(model, mode="reduce-overhead")
    recipe = te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID, amax_history_len=16,
                                      amax_compute_algo="max") if build == "te8" else None
    step_no = [0]

    def step():
        opt.zero_grad(set_to_none=True)
        if te:
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                loss = fwd(idx, tgt)
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        lr.fill_(lr_at(step_no[0]))
        opt.step()
        step_no[0] += 1
        return loss

    for _ in range(args.warmup):
        loss = step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / args.steps * 1e3)
    ms = statistics.median(times)
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    tokens = c["B"] * c["T"] / ms * 1e3
    mfu = flops_per_token(model, c) * tokens / (PEAK_TFLOPS * 1e12) * 100
    mem = torch.cuda.max_memory_allocated() / 2 ** 30
    print(f"| {name} | torch {build} | {ms:.2f} | {tokens:,.0f} | {mfu:.1f}% | {mem:.2f} | "
          f"{statistics.median(host):.2f} | {loss.item():.3f} |", flush=True)
    del model, opt
    torch.cuda.empty_cache()


def parity(d):
    """bench/gpt_parity.lua's run again in PyTorch: the same weights, batches and optimizer;
    prints both loss curves' windows and their difference."""
    import json
    import os
    import sys
    # the safetensors reader the GPU specs' PyTorch reference uses (float64 on the GPU; the
    # state dict load below copies into the model's float32 parameters)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "spec", "gpu"))
    from torch_reference import load_safetensors
    c = json.load(open(f"{d}/config.json"))
    dev = c.get("device", "cuda")  # cpu: f32 throughout, no autocast
    torch.manual_seed(0)
    model = GPT(c).to(dev)
    w = load_safetensors(f"{d}/init.safetensors", dev)
    names = {"wte.weight": "0.weight", "wpe.weight": "1.weight",
             "lnf.weight": f"2.{c['L']}.weight", "lnf.bias": f"2.{c['L']}.bias"}
    for i in range(c["L"]):
        a, m = f"2.{i}.self_attention.", f"2.{i}.layernorm_mlp."
        for t in ("weight", "bias"):
            names.update({f"blocks.{i}.ln1.{t}": a + "layernorm_qkv.norm." + t,
                          f"blocks.{i}.qkv.{t}": a + "layernorm_qkv." + t,
                          f"blocks.{i}.proj.{t}": a + "proj." + t,
                          f"blocks.{i}.ln2.{t}": m + "norm." + t,
                          f"blocks.{i}.fc1.{t}": m + "fc1." + t,
                          f"blocks.{i}.fc2.{t}": m + "fc2." + t})
    state = {k: w[v] for k, v in names.items()}
    missing = model.load_state_dict(state, strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], betas=tuple(c["betas"]),
                            eps=c["eps"], weight_decay=c["weight_decay"], fused=dev == "cuda")
    B, T = c["B"], c["T"]
    raw = torch.from_numpy(__import__("numpy").fromfile(f"{d}/batches.i32", dtype="int32"))
    raw = raw.view(c["steps"], 2, B, T).long().to(dev)
    losses = []
    for step in range(c["steps"]):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            loss = model(raw[step, 0], raw[step, 1])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    lutra = [float(x) for x in open(f"{d}/lutra_loss.txt").read().split()]
    n = len(losses)
    print(f"# loss parity, {n} steps (bench/gpt_parity.lua's run, torch {torch.__version__})")
    print("| steps | lutra mean loss | torch mean loss | difference |")
    print("|---|---:|---:|---:|")
    for a, b in ((0, 1), (0, 10), (n // 2 - 25, n // 2 + 25), (n - 50, n)):
        lm, tm = statistics.mean(lutra[a:b]), statistics.mean(losses[a:b])
        print(f"| {a + 1}-{b} | {lm:.4f} | {tm:.4f} | {(lm - tm) / tm * 100:+.2f}% |")
    worst = max(range(n), key=lambda i: abs(lutra[i] - losses[i]) / losses[i])
    print(f"largest difference of one step: {(lutra[worst] - losses[worst]) / losses[worst] * 100:+.4f}%"
          f" at step {worst + 1} ({lutra[worst]:.6f} against {losses[worst]:.6f})")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parity", metavar="DIR",
                   help="instead: PyTorch's side of bench/gpt_parity.lua's run in DIR")
    p.add_argument("--configs", default="small,gpt2")
    p.add_argument("--builds", default="eager,compile,compile-cg,te,te8")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.parity:
        parity(args.parity)
        return
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print("| config | build | ms/step | tokens/s | MFU | peak GiB | host ms/step | loss |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name in args.configs.split(","):
        for build in args.builds.split(","):
            try:
                run(name, CONFIGS[name], build, args)
            except Exception as e:  # a build this machine lacks (TE) is reported, not fatal
                print(f"| {name} | torch {build} | failed: {type(e).__name__}: {str(e)[:160]} |",
                      flush=True)


if __name__ == "__main__":
    main()
