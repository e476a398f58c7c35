#!/usr/bin/env bash
# Tunes the tile order of the 64x64 quantize kernels (LUTRA_TILE_BAND, kernels/quantize_tile64.cu):
# runs the memory-bound part of bench/cuda_throughput.c against liblutra.so builds made with
# other bands, one after the other on the GPU machine. Build the variants first (anywhere with
# nvcc; the lent machine's time is scarce), e.g. for band 8:
#   git archive HEAD | tar -x -C /tmp/b8 && make -C /tmp/b8 CUDA=1 \
#     NVCCFLAGS="-O3 -lineinfo -DLUTRA_TILE_BAND=8" && mkdir -p build/band8 && cp /tmp/b8/liblutra.so build/band8/
# then, on the GPU machine: bash bench/probes/tile_band_sweep.sh build/band8 build/band32 ...
# (the default build, band 8, runs first). Tables go to $OUT (or /tmp): throughput-<dir>.md.
set -euo pipefail
OUTDIR=${OUT:-/tmp}
gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc -I/usr/local/cuda/include bench/cuda_throughput.c \
  -o build/cuda_throughput -L. -llutra -L/usr/local/cuda/lib64 -lcudart -lcublasLt \
  -Wl,-rpath,"$PWD" -Wl,-rpath,/usr/local/cuda/lib64
for dir in . "$@"; do
  name=$(basename "$(cd "$dir" && pwd)")
  echo "== $dir"
  LD_LIBRARY_PATH=$dir LUTRA_BENCH_MEMORY_ONLY=1 timeout 200 ./build/cuda_throughput \
    "$OUTDIR/throughput-$name.md" | grep -E "cast \+ transpose|MXFP8|copy" | tail -8
done
