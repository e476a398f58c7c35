#!/usr/bin/env bash
# Host overhead of lutra on the GPU, in one run: lutra's figures from LuaJIT
# (bench/host_overhead.lua), each beside its floor (the raw launches and GEMMs it issues,
# counted, issued by bench/host_floors.cu's library from the same process, batches alternating)
# and PyTorch's figure for the same work (bench/torch_overhead.py), merged into one markdown
# table with the ratios and whether each target is met.
#
# On the GPU machine, from the repository root, with liblutra.so built with CUDA (make):
#   source .devkit/enter.sh && bash bench/host_suite.sh [TABLE.md]
# The table goes to TABLE.md, else $OUT/host_overhead.md when $OUT is set, else
# bench/host_overhead.md, and the same with every GEMM and kernel issued directly to
# TABLE-direct.md;
# the raw outputs (host_counts_*.txt, host_torch.txt, host_lutra_*.txt) go to $OUT, else
# build/host_suite/.
# About a minute (PyTorch's import and CUDA start-up take most of it).
# Environment: SHAPES (default "--batch 64 --in 64 --out 64"), HIDDEN (MLP width, 128),
# BATCHES (15), PYTHON (python3), LUAJIT (luajit), NVCC, CUDA_HOME (/usr/local/cuda),
# PIN (a command prefix for the programs; default "taskset -c <the last core>" where taskset
# exists, so that lutra and PyTorch run on the same core; PIN= runs them unpinned), DEVICE (cuda; cpu runs
# only lutra on the CPU backend: a test of this script on a machine without a GPU).
# shellcheck disable=SC2086 # SHAPES and PIN are word lists, split on purpose
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
PYTHON=${PYTHON:-python3}
LUAJIT=${LUAJIT:-luajit}
SHAPES=${SHAPES:---batch 64 --in 64 --out 64}
HIDDEN=${HIDDEN:-128}
BATCHES=${BATCHES:-15}
if [ -z "${PIN+set}" ]; then
  PIN=$(command -v taskset > /dev/null && echo "taskset -c $(($(nproc) - 1))" || true)
fi
DEVICE=${DEVICE:-cuda}
if [ $# -ge 1 ]; then
  TABLE=$1
elif [ -n "${OUT:-}" ]; then
  TABLE=$OUT/host_overhead.md
else
  TABLE=bench/host_overhead.md
fi
DIR=${OUT:-build/host_suite}
mkdir -p "$(dirname "$TABLE")" "$DIR" build
export LUA_PATH="lua/?.lua;lua/?/init.lua;${LUA_PATH:-;}"
rm -f "$DIR"/host_torch.txt "$DIR"/host_counts_*.txt "$DIR"/host_lutra_*.txt

if [ "$DEVICE" = cuda ]; then
  if [ ! -f liblutra.so ] || ! grep -q '^CUDA=1' build/config 2> /dev/null; then
    echo "host_suite: liblutra.so with CUDA is not built here: run make (make CUDA=1) first" >&2
    exit 1
  fi
  echo "== building build/libhost_floors.so and build/launch_count.so"
  "$NVCC" -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared bench/host_floors.cu \
    bench/host_replay.cu -o build/libhost_floors.so -lcublasLt -lcuda
  gcc -std=c11 -O2 -Wall -Wextra -shared -fPIC -I"$CUDA_HOME/include" bench/launch_count.c \
    -o build/launch_count.so -ldl

  echo "== PyTorch ($PYTHON bench/torch_overhead.py)"
  if ! $PIN "$PYTHON" bench/torch_overhead.py $SHAPES --hidden "$HIDDEN" --batches "$BATCHES" \
    | tee "$DIR/host_torch.txt"; then
    echo "host_suite: torch_overhead.py failed; the PyTorch figures are n/a" >&2
  fi

  echo "== lutra: GPU work per call (bench/launch_count.so preloaded)"
  for mode in graphs direct; do
    if ! LUTRA_GEMM_GRAPHS=$([ $mode = direct ] && echo 0 || echo 1) \
      LUTRA_LAUNCH_GRAPHS=$([ $mode = direct ] && echo 0 || echo 1) \
      LD_PRELOAD=$PWD/build/launch_count.so $PIN "$LUAJIT" bench/host_overhead.lua \
      --device cuda $SHAPES --hidden "$HIDDEN" --count "$DIR/host_counts_$mode.txt"; then
      echo "host_suite: counting failed; the floors use the counts from the code" >&2
      rm -f "$DIR/host_counts_$mode.txt"
    fi
  done
fi

# Twice: as lutra runs by default (eager GEMMs and kernel launches seen before replay as cached
# graphs, src/backend/cuda/call_graphs.c), and with LUTRA_GEMM_GRAPHS=0 LUTRA_LAUNCH_GRAPHS=0
# (every GEMM a direct cublasLtMatmul, every kernel a direct launch: the raw calls their floors
# issue): TABLE, and TABLE with -direct before .md.
for mode in graphs direct; do
  table=$TABLE
  [ $mode = direct ] && table=${TABLE%.md}-direct.md
  echo "== lutra: host time per call ($mode GEMMs and kernel launches)"
  # LUTRA_LOG_PLANS=1: each GEMM plan's algorithm goes to stderr, beside host_floors' own
  LUTRA_GEMM_GRAPHS=$([ $mode = direct ] && echo 0 || echo 1) \
    LUTRA_LAUNCH_GRAPHS=$([ $mode = direct ] && echo 0 || echo 1) LUTRA_LOG_PLANS=1 \
    $PIN "$LUAJIT" bench/host_overhead.lua --device "$DEVICE" $SHAPES --hidden "$HIDDEN" \
    --batches "$BATCHES" --floors-lib build/libhost_floors.so --torch "$DIR/host_torch.txt" \
    --counts "$DIR/host_counts_$mode.txt" --table "$table" | tee "$DIR/host_lutra_$mode.txt"
  [ "$DEVICE" = cuda ] || break
done
