"""One step's GPU time per kernel from Nsight Compute's raw CSV (bench/gpt_profile.lua's run):
  python3 bench/ncu_kernels.py --steps N FILE.csv [FILE2.csv]
Kernels are named without their template arguments (--args keeps them: a template's instances
apart) and parameter lists; each name's time and
launches are summed over the run and divided by --steps (a kernel launched fewer times than
--steps, the set-up's, is left out). With two files (bf16 and FP8, say) their columns stand
side by side."""
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


def per_step(kernels, steps):
    us, n = collections.defaultdict(float), collections.Counter()
    for name, t in kernels:
        us[name] += t
        n[name] += 1
    return {k: (us[k] / steps, n[k] / steps) for k in us if n[k] >= steps}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--args", action="store_true", help="keep template arguments")
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    runs = [per_step(load(f, a.args), a.steps) for f in a.files]
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
