#!/usr/bin/env bash
# The norm kernels of commit BASE (default HEAD) against this tree's, side by side
# (tools/norm_ab/main.cu); run from the repository root on the GPU machine. Writes
# ${OUT:-.}/norm_ab${NORM_AB_TAG:+-TAG}.md; exits 1 when an output differs.
#   bash tools/norm_ab/run.sh [BASE] (BASE's files are taken from build/norm-ab-base/ when
#   that directory exists, as it must where the checkout has no git history)
# NORM_AB_NO_RUN=1 only builds build/norm_ab (to overlap the build with other work; run
# `build/norm_ab FILE.md` later, on an otherwise idle machine).
# BASE must have the family folders (kernels/norm/, kernels/quantize/, kernels/common/): the
# base's norm files include the helper library by those paths, which resolve to this tree's.
# NORM_AB_CAND=DIR takes the candidate's norm.cu and norm_quantize.cu (and, where DIR has them,
# norm_rows.cuh, norm_bwd_rows.cuh, norm_quantize_rows.cuh, norm_quantize_tile.cuh,
# cast_transpose_16bit.cu and quantize_block.cu) from DIR instead of kernels/norm/ (and
# kernels/quantize/), and NORM_AB_TAG=NAME names its objects and program build/norm_ab-NAME:
# several candidates against one base, built side by side.
# NORM_AB_NVCC_FLAGS adds nvcc flags to every object (e.g. -lineinfo, for Nsight Compute's
# source view).
set -euo pipefail
base_dir=build/norm-ab-base
cand_dir=${NORM_AB_CAND:-kernels/norm}
tag=${NORM_AB_TAG:+-$NORM_AB_TAG}
if [ ! -d "$base_dir" ]; then
  mkdir -p "$base_dir"
  for f in norm.cu norm_rows.cuh norm_bwd_rows.cuh norm_quantize.cu norm_quantize_rows.cuh \
           norm_quantize_tile.cuh; do
    git show "${1:-HEAD}:kernels/norm/$f" > "$base_dir/$f" 2> /dev/null || rm -f "$base_dir/$f"
  done
fi
flags=(-std=c++17 -O3 -arch=sm_90 -Isrc -Ikernels ${NORM_AB_NVCC_FLAGS:-})
[ -f "build/norm_ab_base.o" ] && [ -n "$tag" ] || \
  nvcc "${flags[@]}" -DAB_PREFIX=base "-DAB_DIR_NORM=\"../../$base_dir/norm.cu\"" \
    "-DAB_DIR_QUANT=\"../../$base_dir/norm_quantize.cu\"" -c tools/norm_ab/variant.cu -o build/norm_ab_base.o &
pids=($!)
nvcc "${flags[@]}" -DAB_PREFIX=cand "-DAB_DIR_NORM=\"../../$cand_dir/norm.cu\"" \
  "-DAB_DIR_QUANT=\"../../$cand_dir/norm_quantize.cu\"" -c tools/norm_ab/variant.cu -o "build/norm_ab_cand$tag.o" &
pids+=($!)
# the quantizer's tile kernels, which a tree's fused norm may launch (lkq::launch_t128,
# launch_block_norm): the candidate's, linked once (a base that calls them gets these too)
tiles=()
for f in cast_transpose_16bit quantize_block; do
  src=kernels/quantize/$f.cu
  [ -f "$cand_dir/$f.cu" ] && src=$cand_dir/$f.cu
  nvcc "${flags[@]}" -c "$src" -o "build/norm_ab_$f$tag.o" &
  pids+=($!)
  tiles+=("build/norm_ab_$f$tag.o")
done
for p in "${pids[@]}"; do wait "$p"; done
nvcc "${flags[@]}" -Ibench tools/norm_ab/main.cu build/norm_ab_base.o "build/norm_ab_cand$tag.o" \
  "${tiles[@]}" -o "build/norm_ab$tag"
[ "${NORM_AB_NO_RUN:-0}" = 1 ] && exit 0
"./build/norm_ab$tag" "${OUT:-.}/norm_ab$tag.md"
