"""One step's GPU time per kernel from Nsight Compute's raw CSV (bench/gpt_profile.lua's run):
  python3 bench/ncu_kernels.py --steps N FILE.csv [FILE2.csv] [--base B.csv [B2.csv] --base-steps M]
Kernels are named without their template arguments (--args keeps them: a template's instances
apart) and parameter lists; each name's time and launches are summed over the run and divided by
--steps (a kernel launched fewer times than --steps is left out). The set-up's kernels (weights
and gradients initialized, the optimizer's f32 copies: one a parameter) come in the sums too;
--base takes a run of the same script with M steps (one base a file, in order) and subtracts it,
kernel by kernel, dividing by N - M: what is left is the steps' alone. With two files (bf16 and
FP8, say) their columns stand side by side."""
import argparse
import collections
import csv
import re


def load(path, args=False):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    names = rows[head]
    k, t = names.index("Kernel Name"), names.index("gpu__time_duration.sum")
    unit = rows[head + 1][t]
    # Nsight Compute names the unit either way (nsecond or ns, by version)
    scales = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    if unit not in scales:
        raise SystemExit(f"ncu_kernels.py: unknown time unit {unit!r} in {path}")
    scale = scales[unit]
    out = []
    for r in rows[head + 2:]:
        try:
            out.append((short(r[k], args), float(r[t].replace(",", "")) * scale))
        except (ValueError, IndexError):
            pass
    return out


def short(name, args=False):
    """the kernel's name without namespaces' template arguments (unless args) or parameters"""
    name = re.sub(r"\(.*$", "", name.replace("(anonymous namespace)::", ""))
    if args:
        return re.sub(r"^void ", "", name).strip()[:100]
    depth, out = 0, []
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    return re.sub(r"^void ", "", "".join(out)).strip()[:100]


def sums(kernels):
    us, n = collections.defaultdict(float), collections.Counter()
    for name, t in kernels:
        us[name] += t
        n[name] += 1
    return us, n


def per_step(kernels, steps, base=None, base_steps=0):
    """each kernel's time and launches a step, less a base run's (base_steps steps) where given"""
    us, n = sums(kernels)
    if base is not None:
        bus, bn = sums(base)
        for k in bus:
            us[k] -= bus[k]
            n[k] -= bn[k]
    d = steps - base_steps
    return {k: (us[k] / d, n[k] / d) for k in us if n[k] >= d}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--args", action="store_true", help="keep template arguments")
    p.add_argument("--base", nargs="+", default=[], help="runs of fewer steps, one a file")
    p.add_argument("--base-steps", type=int, default=1)
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.base and len(a.base) != len(a.files):
        raise SystemExit("ncu_kernels.py: --base takes one run a file "
                         f"({len(a.base)} for {len(a.files)})")
    if a.base and a.base_steps >= a.steps:
        raise SystemExit("ncu_kernels.py: --base-steps must be fewer than --steps")
    bases = [load(f, a.args) for f in a.base] or [None] * len(a.files)
    runs = [per_step(load(f, a.args), a.steps, b, a.base_steps if b else 0)
            for f, b in zip(a.files, bases)]
    names = sorted(set().union(*runs), key=lambda k: -max(r.get(k, (0, 0))[0] for r in runs))
    head = " | ".join(f"{f} us | launches" for f in a.files)
    print(f"| kernel | {head} |")
    print("|---|" + "---:|---:|" * len(runs))
    for k in names[: a.top]:
        cells = " | ".join(f"{r[k][0]:.0f} | {r[k][1]:g}" if k in r else "- | -" for r in runs)
        print(f"| {k} | {cells} |")
    totals = " | ".join(f"{sum(v[0] for v in r.values()):.0f} | {sum(v[1] for v in r.values()):g}"
                        for r in runs)
    print(f"| one step, all kernels | {totals} |")


if __name__ == "__main__":
    main()
