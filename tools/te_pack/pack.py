#!/usr/bin/env python3
"""Pack TransformerEngine 2.20.2 (PyTorch, CUDA 13) for an offline sm_90 machine, in < 30 MiB.

Usage: python3 tools/te_pack/pack.py [--out ROOT] [--python-tag cp312] [--cache DIR]

Writes (and first empties) ROOT/.whl/te/ and ROOT/.te/:
  .whl/te/  TE's core wheel for CUDA 13, repacked without libtransformer_engine.so and without the
            optional libnccl_ep.so (nothing links it: the core library dlopens it for the NCCL EP
            feature only, and TE reports EP unavailable without it); the `transformer_engine`
            meta wheel and the `transformer_engine_torch` sdist as published; the pure-Python
            runtime dependencies that the lent machine's image lacks (pydantic and its own).
  .te/      libtransformer_engine.so.xz: the core library with only sm_90/sm_90a device code;
            cudnn_frontend-<v>-include.tar.xz: cudnn-frontend's C++ headers; install.sh,
            te_cast_check.py; MANIFEST.txt (sizes, sha256 sums, what the pruning kept).

Pruning: every fatbin container in the library's .nv_fatbin section keeps its entries for sm_90
(and sm_90a) byte for byte, moved to the front of the container; its header's size field is cut
to them and the bytes freed behind them are zeroed. The file keeps its size and every byte
outside the containers (ELF headers, code, the pointers to each container), so it loads as
before; cuobjdump and the driver see valid containers that hold only sm_90 images. (Zeroing the
other payloads in place, headers kept, is not enough: they are compressed and cuobjdump fails
with "Uncompress failed" on them.) nvprune only takes object files and static libraries.

Everything is pinned; two runs give identical files.
"""
import argparse
import hashlib
import io
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile

TE_VERSION = "2.20.2"
CUDNN_FE_VERSION = "1.30.0"  # the newest on PyPI when TE 2.20.2's wheels were built (TE asks >=1.29)
CORE = "transformer_engine_cu13"
CUOBJDUMP_VERSION = "13.5.37"  # only to verify the pruning here
# (distribution, version): wheels that go to .whl/te (pip --no-deps, so each is named)
WHEELS = [
    (CORE, TE_VERSION),
    ("transformer_engine", TE_VERSION),
    ("pydantic", "2.14.4"),  # transformer_engine.common.recipe imports it at load
    ("pydantic-core", "2.50.5"),
    ("annotated-types", "0.8.0"),
    ("typing-inspection", "0.4.5"),
    ("typing-extensions", "4.16.0"),  # pydantic 2.14 wants >= 4.16; install.sh skips it if newer there
]
SDIST = ("transformer_engine_torch", TE_VERSION,
         "4c40ced8a6261649e689076f198d4feaf02277b1ba18931a66eccdaceb33c43e")
DROP_FROM_CORE = ("transformer_engine/wheel_lib/libtransformer_engine.so",
                  "transformer_engine/wheel_lib/libnccl_ep.so")
CORE_LIB = "transformer_engine/wheel_lib/libtransformer_engine.so"
KEEP_ARCH = 90  # entry arch field; sm_90a has the same number and a flag bit
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64"]
FATBIN_MAGIC = 0xBA55ED50
HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print("[te_pack]", *a, flush=True)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- downloads

def pip_download(names, dest, tag):
    pyver = tag[2] + "." + tag[3:]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", pyver, "--implementation", "cp", "--abi", tag, "-d", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += [f"{n}=={v}" for n, v in names]
    log("pip download", " ".join(f"{n}=={v}" for n, v in names))
    subprocess.run(cmd, check=True)


def find_file(dest, dist, version, suffix):
    """The one wheel (suffix .whl) of dist==version in dest."""
    prefix = re.sub(r"[-_.]+", "_", dist).lower() + f"-{version}-"
    hits = sorted(f for f in os.listdir(dest) if f.lower().startswith(prefix) and f.endswith(suffix))
    if len(hits) != 1:
        sys.exit(f"expected one {dist} {version} {suffix} in {dest}, found {hits}")
    return os.path.join(dest, hits[0])


def index_url():
    out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                         capture_output=True, text=True)
    url = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else \
        os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    return url.rstrip("/") + "/"


def download_sdist(dest):
    """pip download of an sdist prepares its metadata, which here needs torch: fetch it from
    the simple index and check the pinned sha256 instead."""
    name, version, digest = SDIST
    fname = f"{name}-{version}.tar.gz"
    path = os.path.join(dest, fname)
    if os.path.exists(path) and sha256(open(path, "rb").read()) == digest:
        return path
    page_url = index_url() + name.replace("_", "-") + "/"
    log("sdist from", page_url)
    page = urllib.request.urlopen(page_url, timeout=120).read().decode()
    links = [h for h in re.findall(r'href="([^"]+)"', page) if fname in h]
    if not links:
        sys.exit(f"{fname} not on {page_url}")
    url = urllib.parse.urljoin(page_url, links[0].replace("&amp;", "&")).split("#")[0]
    data = urllib.request.urlopen(url, timeout=300).read()
    if sha256(data) != digest:
        sys.exit(f"{fname}: sha256 {sha256(data)} is not the pinned {digest}")
    with open(path, "wb") as f:
        f.write(data)
    return path


# ---------------------------------------------------------------- fatbin pruning

def elf_section(data, want):
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]
    for name, _typ, _flags, _addr, off, size in secs:
        end = data.index(b"\0", stroff + name)
        if data[stroff + name:end].decode() == want:
            return off, size
    sys.exit(f"no {want} section")


def containers(data, off, size):
    """Yield (start, header_size, fat_size, [(entry_start, entry_len, kind, arch, flags)])."""
    pos, end = off, off + size
    while pos < end:
        magic, = struct.unpack_from("<I", data, pos)
        if magic != FATBIN_MAGIC:  # 8-byte zero padding between containers
            if bytes(data[pos:pos + 8]) != bytes(8):
                sys.exit(f"unexpected bytes at {pos:#x} in .nv_fatbin")
            pos += 8
            continue
        _, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        e, fend, entries = pos + hsize, pos + hsize + fsize, []
        while e < fend:
            kind, _v, ehs, psize = struct.unpack_from("<HHIQ", data, e)
            arch, = struct.unpack_from("<I", data, e + 28)
            flags, = struct.unpack_from("<Q", data, e + 40)
            entries.append((e, ehs + psize, kind, arch, flags))
            e += ehs + psize
        if e != fend:
            sys.exit(f"fatbin at {pos:#x}: entries overrun its size")
        yield pos, hsize, fsize, entries
        pos = fend


def prune(orig):
    """Return the pruned copy of the library and a list of per-container facts."""
    data = bytearray(orig)
    off, size = elf_section(orig, ".nv_fatbin")
    facts = []
    for start, hsize, fsize, entries in containers(orig, off, size):
        keep = [en for en in entries if en[3] == KEEP_ARCH]
        if not keep:
            sys.exit(f"fatbin at {start:#x} has no sm_{KEEP_ARCH} entry; refusing to drop it")
        w = start + hsize
        for e, n, *_ in keep:
            data[w:w + n] = orig[e:e + n]
            w += n
        new_fsize = w - start - hsize
        data[w:start + hsize + fsize] = bytes(start + hsize + fsize - w)
        struct.pack_into("<Q", data, start + 8, new_fsize)
        facts.append((start, hsize, fsize, new_fsize, entries, keep))
    return data, (off, size), facts


def verify_prune(orig, new, section, facts):
    """Check the pruned file against the original without trusting prune()."""
    assert len(orig) == len(new), "size changed"
    off, size = section
    assert orig[:off] == new[:off] and orig[off + size:] == new[off + size:], \
        "bytes outside .nv_fatbin changed"
    reparsed = list(containers(new, off, size))
    assert len(reparsed) == len(facts), "container count changed"
    last = off
    kept = dropped = 0
    for (start, hsize, fsize, new_fsize, entries, keep), got in zip(facts, reparsed):
        # bytes between containers (padding) unchanged
        assert orig[last:start] == new[last:start]
        gstart, ghsize, gfsize, gentries = got
        assert (gstart, ghsize, gfsize) == (start, hsize, new_fsize)
        h = start
        assert orig[h:h + 8] == new[h:h + 8] and orig[h + 16:h + hsize] == new[h + 16:h + hsize]
        assert [(k, a, fl) for _, _, k, a, fl in gentries] == [(k, a, fl) for _, _, k, a, fl in keep]
        for (e0, n0, *_), (e1, n1, *_) in zip(keep, gentries):
            assert n0 == n1 and orig[e0:e0 + n0] == new[e1:e1 + n1], "kept entry differs"
        tail = start + hsize + new_fsize
        assert new[tail:start + hsize + fsize] == bytes(start + hsize + fsize - tail)
        assert all(a == KEEP_ARCH for _, _, _, a, _ in gentries)
        kept += sum(n for _, n, *_ in keep)
        dropped += sum(n for _, n, _, a, _ in entries if a != KEEP_ARCH)
        last = start + hsize + fsize
    assert orig[last:off + size] == new[last:off + size]
    return kept, dropped


def arch_name(arch, flags):
    # flag bits seen in CUDA 13 fatbins: 0x100000 marks an arch-specific ('a') image
    return f"sm_{arch}" + ("a" if flags & 0x100000 else "")


def tool_checks(orig_path, new_path, cuobjdump, report):
    """readelf -d / nm -D equality, and cuobjdump: the sm_90 cubins it extracts from both
    files are byte-identical. Skipped, with a line in the report, where a tool is missing."""
    for tool, args in (("readelf", ["-d", "-W"]), ("nm", ["-D"])):
        if not shutil.which(tool):
            report.append(f"{tool}: not found, skipped")
            continue
        outs = [subprocess.run([tool] + args + [p], capture_output=True, check=True).stdout
                for p in (orig_path, new_path)]
        assert outs[0] == outs[1], f"{tool} {' '.join(args)} differs"
        report.append(f"{tool} {' '.join(args)}: identical ({len(outs[0].splitlines())} lines)")
    if not cuobjdump:
        report.append("cuobjdump: not found (pass --cuobjdump PATH), skipped")
        return
    lst = subprocess.run([cuobjdump, "-lelf", new_path], capture_output=True, text=True)
    assert lst.returncode == 0, f"cuobjdump -lelf failed on the pruned library: {lst.stderr}"
    names = [ln.split()[-1] for ln in lst.stdout.splitlines() if ln.startswith("ELF file")]
    archs = sorted({n.split(".")[-2] for n in names})
    assert archs and all(a in ("sm_90", "sm_90a") for a in archs), archs
    report.append(f"cuobjdump -lelf (pruned): {len(names)} cubins, archs {archs}")
    sums = []
    for p in (orig_path, new_path):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([cuobjdump, "-xelf", "sm_90", os.path.abspath(p)], cwd=d, check=True,
                           capture_output=True)
            sums.append(sorted(hashlib.md5(open(os.path.join(d, f), "rb").read()).hexdigest()
                               for f in os.listdir(d)))
    assert sums[0] == sums[1] and sums[0], "cuobjdump -xelf sm_90: extracted cubins differ"
    report.append(f"cuobjdump -xelf sm_90: {len(sums[0])} cubins from each file, identical md5s")


# ---------------------------------------------------------------- deterministic archives

def repack_core(src, dst):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for zi in zin.infolist():
            if zi.filename in DROP_FROM_CORE:
                continue
            data = zin.read(zi)
            if zi.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines
                               if ln.split(",")[0] not in DROP_FROM_CORE).encode()
            out = zipfile.ZipInfo(zi.filename, date_time=zi.date_time)
            out.external_attr = zi.external_attr
            out.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(out, data, compresslevel=9)


def headers_tar(wheel, dst):
    """cudnn-frontend's include/ from its wheel, as a tar.xz with fixed metadata."""
    buf = io.BytesIO()
    with zipfile.ZipFile(wheel) as z, tarfile.open(fileobj=buf, mode="w",
                                                   format=tarfile.GNU_FORMAT) as tar:
        names = sorted(n for n in z.namelist() if n.startswith("include/") and not n.endswith("/"))
        if not any(n.endswith("/cudnn_frontend.h") or n == "include/cudnn_frontend.h"
                   for n in names):
            sys.exit(f"{wheel} holds no include/cudnn_frontend.h")
        for n in names:
            data = z.read(n)
            ti = tarfile.TarInfo(n)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid = len(data), 0, 0o644, 0, 0
            tar.addfile(ti, io.BytesIO(data))
    with open(dst, "wb") as f:
        f.write(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    return len(names)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.getcwd(), help="repo root to write .whl/te and .te into")
    ap.add_argument("--python-tag", default="cp312", help="the lent machine's Python, as cpXY")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/lutra-te-pack"),
                    help="where downloads are kept between runs")
    ap.add_argument("--cuobjdump", default="auto",
                    help="cuobjdump to verify the pruned library with; 'auto' (default): the "
                         "one on PATH or in CUDA_HOME, else from the nvidia-cuda-cuobjdump wheel; "
                         "'none': skip that check")
    args = ap.parse_args()
    if not re.fullmatch(r"cp3\d+", args.python_tag):
        sys.exit("--python-tag must look like cp312")
    root = os.path.abspath(args.out)
    dl = os.path.join(args.cache, "dl", args.python_tag)
    os.makedirs(dl, exist_ok=True)

    pip_download(WHEELS + [("nvidia-cudnn-frontend", CUDNN_FE_VERSION)], dl, args.python_tag)
    sdist = download_sdist(dl)
    wheels = {n: find_file(dl, n, v, ".whl") for n, v in WHEELS}
    fe_wheel = find_file(dl, "nvidia-cudnn-frontend", CUDNN_FE_VERSION, ".whl")

    cuobjdump = find_cuobjdump(args.cuobjdump, args.cache)
    whl_dir, te_dir = os.path.join(root, ".whl", "te"), os.path.join(root, ".te")
    for d in (whl_dir, te_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)

    # core library: prune, verify, compress
    with zipfile.ZipFile(wheels[CORE]) as z:
        orig = z.read(CORE_LIB)
    log(f"{CORE_LIB}: {len(orig)} bytes; pruning to sm_{KEEP_ARCH}")
    new, section, facts = prune(orig)
    kept, dropped = verify_prune(orig, new, section, facts)
    report = [f"library: {len(orig)} bytes before and after; .nv_fatbin {section[1]} bytes at "
              f"{section[0]:#x}; {len(facts)} fatbin containers",
              f"kept {kept} bytes of sm_90/sm_90a entries, zeroed {dropped} bytes of others",
              "entries kept per arch: " + ", ".join(
                  f"{a} {n}" for a, n in sorted(count_archs(facts, True).items())),
              "entries dropped per arch: " + ", ".join(
                  f"{a} {n}" for a, n in sorted(count_archs(facts, False).items())),
              "self-check: outside .nv_fatbin identical; each container keeps its sm_90 "
              "entries byte for byte, its other bytes zero: passed"]
    with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
        op, np_ = os.path.join(tmp, "orig.so"), os.path.join(tmp, "pruned.so")
        for p, d in ((op, orig), (np_, new)):
            with open(p, "wb") as f:
                f.write(d)
        tool_checks(op, np_, cuobjdump, report)
    for line in report:
        log(line)
    log("compressing (xz, x86 filter, preset 9e; about a minute)")
    xz = lzma.compress(bytes(new), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=[
        {"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}])
    with open(os.path.join(te_dir, "libtransformer_engine.so.xz"), "wb") as f:
        f.write(xz)
    with open(os.path.join(te_dir, "libtransformer_engine.so.sha256"), "w") as f:
        f.write(f"{sha256(new)}  libtransformer_engine.so\n")
    del orig, new

    # wheels and sdist
    repack_core(wheels[CORE], os.path.join(whl_dir, os.path.basename(wheels[CORE])))
    for n, _ in WHEELS[1:]:
        shutil.copy(wheels[n], whl_dir)
    shutil.copy(sdist, whl_dir)
    nhdr = headers_tar(fe_wheel, os.path.join(te_dir, f"cudnn_frontend-{CUDNN_FE_VERSION}-include.tar.xz"))
    log(f"cudnn-frontend {CUDNN_FE_VERSION}: {nhdr} headers")
    for f in ("install.sh", "te_cast_check.py"):
        shutil.copy(os.path.join(HERE, f), te_dir)

    # manifest
    files = sorted([os.path.join(".whl/te", f) for f in os.listdir(whl_dir)] +
                   [os.path.join(".te", f) for f in os.listdir(te_dir)])
    lines, total = [], 0
    for rel in files:
        data = open(os.path.join(root, rel), "rb").read()
        total += len(data)
        lines.append(f"{len(data):>10}  {sha256(data)}  {rel}")
    man = [f"TransformerEngine {TE_VERSION} pack for sm_90, Python {args.python_tag}",
           *lines, f"{total:>10}  total ({total / 2**20:.2f} MiB, MANIFEST.txt not counted)", "",
           "pruning:", *("  " + ln for ln in report)]
    with open(os.path.join(te_dir, "MANIFEST.txt"), "w") as f:
        f.write("\n".join(man) + "\n")
    print("\n".join(man))
    if total > 30 * 2**20:
        sys.exit(f"total {total} bytes is over 30 MiB")


def find_cuobjdump(choice, cache):
    if choice != "auto":
        return "" if choice == "none" else choice
    for c in (shutil.which("cuobjdump"),
              os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")):
        if c and os.access(c, os.X_OK):
            return c
    d = os.path.join(cache, "cuobjdump")
    exe = os.path.join(d, "nvidia", "cu13", "bin", "cuobjdump")
    if not os.path.exists(exe):
        os.makedirs(d, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
                        "-d", d, f"nvidia-cuda-cuobjdump=={CUOBJDUMP_VERSION}"], check=True)
        with zipfile.ZipFile(find_file(d, "nvidia-cuda-cuobjdump", CUOBJDUMP_VERSION, ".whl")) as z:
            z.extract("nvidia/cu13/bin/cuobjdump", d)
        os.chmod(exe, 0o755)
    return exe


def count_archs(facts, kept):
    out = {}
    for *_, entries, keep in facts:
        for e in (keep if kept else [x for x in entries if x[3] != KEEP_ARCH]):
            name = arch_name(e[3], e[4])
            out[name] = out.get(name, 0) + 1
    return out


if __name__ == "__main__":
    main()
