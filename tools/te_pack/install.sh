#!/usr/bin/env bash
# Install TransformerEngine 2.20.2 for PyTorch on the lent GPU machine, offline, from what
# tools/te_pack/pack.py left in .whl/te/ and .te/ (run from the repo root, or set TE_PACK_ROOT).
#   bash tools/te_pack/install.sh [LOGFILE]
# Result: TE importable with PYTHONPATH=$TE_SITE (default /tmp/site). Import torch before
# transformer_engine: TE's core library needs libnccl.so.2/libcublas.so.13, which torch loads.
# Environment: PYTHON (python3), TE_SITE (/tmp/site), TE_BUILD_DIR (/tmp/te_build),
# MAX_JOBS (16), CUDA_HOME (from nvcc on PATH, else /usr/local/cuda). TE_DRY_RUN=1 (for a
# machine without torch or GPU): skip the checks of torch and nvcc, the extension build and the
# import; unpack, install the wheels and restore the library all the same.
set -euo pipefail
if [ $# -ge 1 ]; then
  exec > >(tee "$1") 2>&1
fi

ROOT=${TE_PACK_ROOT:-$PWD}
PY=${PYTHON:-python3}
SITE=${TE_SITE:-/tmp/site}
BUILD=${TE_BUILD_DIR:-/tmp/te_build}
JOBS=${MAX_JOBS:-16}
DRY=${TE_DRY_RUN:-0}
WHL=$ROOT/.whl/te
TE=$ROOT/.te
LIB=$SITE/transformer_engine/wheel_lib/libtransformer_engine.so
T0=$SECONDS

step() { echo "=== [te_install +$((SECONDS - T0))s] $*"; }
die() { echo "=== [te_install] FAILED: $*" >&2; exit 1; }
trap 'echo "=== [te_install] FAILED at line $LINENO (exit $?)" >&2' ERR

check_machine() {
  "$PY" - <<'EOF' || die "the machine's Python lacks what TE needs (above)"
import importlib, sys
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
assert torch.version.cuda and torch.version.cuda.split(".")[0] == "13", "torch is not a CUDA 13 build"
missing = []
# imported when transformer_engine.pytorch loads, or by the build; the image has them
for m in ("numpy", "onnx", "onnxscript", "einops", "triton", "packaging", "setuptools",
          "wheel.bdist_wheel", "torch.utils.cpp_extension"):
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001
        missing.append(f"{m} ({e})")
if missing:
    print("missing:", ", ".join(missing)); sys.exit(1)
from torch.utils.cpp_extension import is_ninja_available
if not is_ninja_available():
    print("warning: no ninja; torch will compile the 33 files one by one (slow)")
EOF
  if [ -z "${CUDA_HOME:-}" ]; then
    if command -v nvcc >/dev/null; then
      CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    else
      CUDA_HOME=/usr/local/cuda
    fi
  fi
  export CUDA_HOME
  [ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc in $CUDA_HOME/bin"
  "$CUDA_HOME/bin/nvcc" --version | tail -n 1
}

# cudnn.h and nccl.h: from the nvidia wheels beside torch (nvidia may be a namespace package)
nvidia_includes() {
  "$PY" - <<'EOF'
import os, nvidia
roots = [os.path.dirname(nvidia.__file__)] if getattr(nvidia, "__file__", None) else list(nvidia.__path__)
found = {}
for r in roots:
    for sub in sorted(os.listdir(r)):
        for h in ("cudnn.h", "nccl.h"):
            p = os.path.join(r, sub, "include")
            if h not in found and os.path.isfile(os.path.join(p, h)):
                found[h] = p
for h in ("cudnn.h", "nccl.h"):
    if h not in found:
        raise SystemExit(f"{h} not found under {roots}")
print(":".join(dict.fromkeys(found.values())))
EOF
}

build_extension() {
  local nv_inc b0
  nv_inc=$(nvidia_includes) || die "cuDNN/NCCL headers not found in torch's nvidia packages"
  export CPATH="$BUILD/fe/include:$nv_inc${CPATH:+:$CPATH}"
  echo "CPATH=$CPATH"
  export NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$JOBS
  export NVTE_WITH_NCCL_EP=0           # libnccl_ep.so is not carried
  export NVTE_NO_LOCAL_VERSION=1       # the version must read 2.20.2, as the core's does
  export NVTE_PYTORCH_FORCE_BUILD=TRUE # do not try to download a prebuilt wheel
  b0=$SECONDS
  # the whole log goes to build.log; ninja's "[i/n]" progress lines are shown, cut short
  if ! "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-index -w "$BUILD/dist" "$SRC" 2>&1 |
    tee "$BUILD/build.log" |
    { grep --line-buffered -E '^\[[0-9]+/[0-9]+\] ' | while IFS= read -r l; do echo "  ${l:0:140}"; done || true; }; then
    tail -n 80 "$BUILD/build.log"
    die "extension build failed (whole log: $BUILD/build.log)"
  fi
  EXT=("$BUILD"/dist/transformer_engine_torch-*.whl)
  [ -f "${EXT[0]}" ] || die "no wheel in $BUILD/dist"
  echo "built $(basename "${EXT[0]}") in $((SECONDS - b0))s"
}

# the carried dependency wheels that the machine lacks, or has in an older version
missing_deps() {
  "$PY" - "$WHL" <<'EOF'
import os, re, sys
from importlib import metadata
def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])
for f in sorted(os.listdir(sys.argv[1])):
    if not f.endswith(".whl") or f.startswith("transformer_engine"):
        continue
    name, ver = f.split("-")[:2]
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    print(f"  {name} {ver}: machine has {have or 'none'}", file=sys.stderr)
    if have is None or key(have) < key(ver):
        print(os.path.join(sys.argv[1], f))
EOF
}

restore_library() {
  "$PY" - "$TE/libtransformer_engine.so.xz" "$LIB" "$TE/libtransformer_engine.so.sha256" <<'EOF'
import hashlib, lzma, shutil, sys
src, dst, sumfile = sys.argv[1:]
with lzma.open(src) as fi, open(dst, "wb") as fo:
    shutil.copyfileobj(fi, fo, 1 << 24)
want = open(sumfile).read().split()[0]
got = hashlib.sha256(open(dst, "rb").read()).hexdigest()
if got != want:
    sys.exit(f"sha256 of {dst} is {got}, expected {want}")
print("restored", dst)
EOF
  chmod 755 "$LIB"
}

step "checking the pack and the machine"
[[ -d "$WHL" && -f "$TE/libtransformer_engine.so.xz" ]] ||
  die "no $WHL or $TE/libtransformer_engine.so.xz: run tools/te_pack/pack.py --out <repo> first"
SDIST=$(ls "$WHL"/transformer_engine_torch-*.tar.gz) || die "no transformer_engine_torch sdist"
FE_TAR=$(ls "$TE"/cudnn_frontend-*-include.tar.xz) || die "no cudnn-frontend headers"
TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
ls "$WHL"/pydantic_core-*-"$TAG"-*.whl >/dev/null 2>&1 ||
  die "$PY is $TAG but the pack's pydantic_core is not: rerun pack.py --python-tag $TAG"
if [ "$DRY" = 1 ]; then
  echo "TE_DRY_RUN=1: no torch, nvcc, build or import"
else
  check_machine
fi

step "unpacking the sdist and cudnn-frontend's headers into $BUILD"
rm -rf "$BUILD"
mkdir -p "$BUILD/src" "$BUILD/fe" "$BUILD/dist"
tar -xzf "$SDIST" -C "$BUILD/src"
SRC=$(echo "$BUILD"/src/transformer_engine_torch-*)
"$PY" - "$FE_TAR" "$BUILD/fe" <<'EOF'
import lzma, sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2], **kw)
EOF
[ -f "$BUILD/fe/include/cudnn_frontend.h" ] || die "cudnn_frontend.h missing after unpacking"

EXT=()
if [ "$DRY" != 1 ]; then
  step "building transformer_engine_torch (MAX_JOBS=$JOBS; a few minutes)"
  build_extension
fi

step "installing the wheels into $SITE"
mkdir -p "$SITE"
DEPS=()
deps_txt=$(missing_deps) || die "could not compare the carried dependencies with the machine's"
[ -z "$deps_txt" ] || mapfile -t DEPS <<<"$deps_txt"
# one pip call: --target --upgrade replaces whole top-level folders, so the three TE wheels
# (all under transformer_engine/) must land together
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
  "$WHL"/transformer_engine_cu13-*.whl "$WHL"/transformer_engine-*-py3-none-any.whl \
  ${EXT[@]+"${EXT[@]}"} ${DEPS[@]+"${DEPS[@]}"}

step "restoring the sm_90 core library"
restore_library
CUOBJ=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
if [ -x "$CUOBJ" ]; then
  echo "cubins in it (cuobjdump -lelf):"
  "$CUOBJ" -lelf "$LIB" | awk '{print $NF}' | sed 's/.*\.\(sm_[0-9a-z]*\)\.cubin/\1/' | sort | uniq -c
fi

if [ "$DRY" = 1 ]; then
  step "dry run: where TE looks for its core library"
  PYTHONPATH=$SITE NVTE_PROJECT_BUILDING=1 "$PY" -c "
import transformer_engine.common as c
p = c._get_shared_object_file('core'); print('core library found at', p); assert str(p) == '$LIB'
"
  step "dry run done"
  exit 0
fi

step "checking the import"
PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} "$PY" -c "
import torch, transformer_engine, transformer_engine.pytorch as te, transformer_engine_torch as tex
print('transformer_engine', transformer_engine.__version__, 'from', transformer_engine.__file__)
print('fp8:', te.is_fp8_available(), 'mxfp8:', te.is_mxfp8_available(),
      'fp8 block scaling:', te.is_fp8_block_scaling_available())
"
step "done: export PYTHONPATH=$SITE (import torch first)"
