#!/usr/bin/env bash
# One batched build-test-bench cycle on the lent GPU machine (see DEVELOPERS' notes):
#   source .devkit/enter.sh && bash tools/gpu-check.sh [steps...]
# steps: build cpu-specs gpu-specs sanitizer example bench norm-bench norm-ab host moe grouped
# dist prenorm probe ncu ncu-norm grouped-profile grouped-quant gpt gpt-profile (default: build cpu-specs gpu-specs sanitizer example bench
# norm-bench host moe). Logs go to $OUT.
set -uo pipefail
# The device tool brings back only a handful of files from $OUT: the logs are written to
# $LOGS and come back as $OUT/logs.tgz, beside $OUT/summary.txt.
OUT=${OUT:-/tmp/lutra-out}
FINAL_OUT=$OUT
OUT=${LOGS:-/tmp/lutra-logs}
rm -rf "$OUT"
mkdir -p "$OUT" "$FINAL_OUT"
steps=${*:-build cpu-specs gpu-specs sanitizer example bench norm-bench host moe}
# the devkit's LuaJIT keeps its jit.* modules (for -jv) under its own prefix
export LUA_PATH="lua/?.lua;lua/?/init.lua;/tmp/devkit/usr/share/luajit-2.1.0-beta3/?.lua;${LUA_PATH:-;}"
summary=()
note() { summary+=("$1"); echo "== $1"; }
has() { [[ " $steps " == *" $1 "* ]]; }
# build/libhost_floors.so (bench/host_floors.cu's floors), built again when a source is newer:
# a stale library lacks what the benches look up in it (the replay floors)
floors_lib() {
  [ build/libhost_floors.so -nt bench/host_floors.cu ] &&
    [ build/libhost_floors.so -nt bench/host_replay.cu ] &&
    [ build/libhost_floors.so -nt bench/host_checks.h ] &&
    [ build/libhost_floors.so -nt bench/support/checks.h ] && return 0
  mkdir -p build
  nvcc -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared bench/host_floors.cu \
    bench/host_replay.cu -o build/libhost_floors.so -lcublasLt -lcuda > "$1" 2>&1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
# the carried kit unpacked again where its luajit is missing (seen once on a fresh machine,
# 2026-12-02, cause not found: every Lua step then failed with "luajit: not found")
if ! command -v luajit > /dev/null && [ -d .devkit ]; then
  for f in .devkit/*.deb; do dpkg -x "$f" /tmp/devkit; done
  export PATH=/tmp/devkit/usr/bin:$PATH
fi
# the benches parse their options with lua-argparse, which the kit holds only when asked:
# DEVKIT_EXTRA=lua-argparse ../shared/tools/device-kit
luajit -e 'require("argparse")' > /dev/null 2>&1 || note "lua-argparse missing: the benches will fail"
if has build; then
  make -j16 CUDA=1 > "$OUT/build.log" 2>&1 && note "build ok" || { note "build FAILED"; tail -40 "$OUT/build.log"; exit 1; }
fi
if has cpu-specs; then
  luajit /tmp/devkit/usr/bin/busted spec > "$OUT/cpu-specs.log" 2>&1
  note "cpu specs: $(grep -E 'successes' "$OUT/cpu-specs.log" | tail -1)"
fi
if has gpu-specs; then
  timeout ${GPU_SPECS_TIMEOUT:-420} luajit /tmp/devkit/usr/bin/busted --pattern=_gpu spec/gpu > "$OUT/gpu-specs.log" 2>&1
  note "gpu specs: $(grep -E 'successes' "$OUT/gpu-specs.log" | tail -1)"
fi
if has sanitizer; then
  # memcheck over the whole GPU suite. LuaJIT must run with its JIT off there (-joff): traces'
  # machine code and compute-sanitizer do not mix (the process dies silently once a loop gets
  # hot), and a plain `timeout` kills the sanitizer's target too (--foreground works). Seen on
  # the H200 machine, 2026-11-29.
  timeout --foreground ${SANITIZER_TIMEOUT:-450} compute-sanitizer --tool memcheck --error-exitcode 9 \
    luajit -joff /tmp/devkit/usr/bin/busted -o plainTerminal --pattern=_gpu spec/gpu \
    > "$OUT/memcheck.log" 2>&1
  note "memcheck exit $?: $(grep -E 'successes' "$OUT/memcheck.log" | tail -1); $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
fi
if has example; then
  for r in none delayed current mxfp8 block; do
    LUTRA_DEVICE=cuda luajit examples/train_mlp.lua --recipe $r --steps 300 --every 100 > "$OUT/example-$r.log" 2>&1
    note "example $r: exit $? $(tail -1 "$OUT/example-$r.log")"
  done
  for r in none delayed; do
    LUTRA_DEVICE=cuda luajit examples/train_mlp.lua --recipe $r --steps 300 --every 100 --graph on \
      > "$OUT/example-graph-$r.log" 2>&1
    note "example $r as a CUDA graph: exit $? $(tail -1 "$OUT/example-graph-$r.log")"
  done
  LUTRA_NVTX=1 LUTRA_DEVICE=cuda luajit examples/train_mlp.lua --recipe delayed --steps 300 --every 100 \
    > "$OUT/example-nvtx.log" 2>&1
  note "example delayed with LUTRA_NVTX=1: exit $? $(tail -1 "$OUT/example-nvtx.log")"
fi
if has probe; then
  nvcc -O2 -arch=sm_90 -Ibench bench/probes/probe_block_gemm.cu -lcublasLt \
    -o build/probe_block_gemm > "$OUT/probe-build.log" 2>&1 &&
    timeout 120 ./build/probe_block_gemm > "$OUT/probe.txt" 2>&1
  note "block-scaled GEMM probe exit $?: $(grep -c MATCH "$OUT/probe.txt") layouts match"
fi
if has bench; then
  gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc -I/usr/local/cuda/include bench/cuda_throughput.c \
    -o build/cuda_throughput -L. -llutra -L/usr/local/cuda/lib64 -lcudart -lcublasLt \
    -Wl,-rpath,"$PWD" -Wl,-rpath,/usr/local/cuda/lib64 > "$OUT/bench-build.log" 2>&1 &&
    timeout 240 ./build/cuda_throughput "$OUT/throughput.md" > "$OUT/bench.log" 2>&1
  note "throughput bench exit $?"
fi
if has norm-bench; then
  gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc -I/usr/local/cuda/include bench/norm_throughput.c \
    -o build/norm_throughput -L. -llutra -L/usr/local/cuda/lib64 -lcudart \
    -Wl,-rpath,"$PWD" -Wl,-rpath,/usr/local/cuda/lib64 > "$OUT/norm-bench-build.log" 2>&1 &&
    timeout 240 ./build/norm_throughput "$OUT/norm_throughput.md" > "$OUT/norm-bench.log" 2>&1
  note "norm throughput bench exit $?"
  [ -f "$OUT/norm_throughput.md" ] && summary+=("$(cat "$OUT/norm_throughput.md")")
fi
if has norm-ab; then
  # this tree's norm kernels against those of commit NORM_BASE (default HEAD: the uncommitted
  # change), side by side in one process, outputs compared byte for byte (tools/norm_ab/run.sh;
  # where the checkout has no git history, put the base's three files in build/norm-ab-base/)
  OUT="$OUT" timeout 400 bash tools/norm_ab/run.sh "${NORM_BASE:-HEAD}" > "$OUT/norm-ab.log" 2>&1
  note "norm A/B exit $?"
  [ -f "$OUT/norm_ab.md" ] && summary+=("$(cat "$OUT/norm_ab.md")")
fi
if has host; then
  timeout 300 bash bench/host_suite.sh "$OUT/host_overhead.md" > "$OUT/host-suite.log" 2>&1
  note "host overhead suite exit $?"
fi
if has ncu; then
  # where the tiled quantizers (kernels/quantize_tile64.cu, quantize_mx16.cu) spend their time
  # (Nsight Compute, if the machine has it);
  # NCU_KERNEL: a regex of the kernels to profile
  LUTRA_DEVICE=cuda timeout 300 ncu --kernel-name regex:"${NCU_KERNEL:-k_tile64|k_mx16}" --launch-count 4 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis luajit bench/probes/quantize_once.lua > "$OUT/ncu.txt" 2>&1
  note "ncu exit $?"
fi
if has ncu-norm; then
  # where the norm kernels spend their time: Nsight Compute over tools/norm_ab (built here when
  # the norm-ab step has not), each kernel's first two launches (norm_ab's output check, base
  # then candidate), one ncu run per kernel: the timing batches after each check would spend a
  # launch count shared by several kernels on the first one's repeats.
  # NCU_NORM_KERNELS: the kernel names (regexes) to profile
  [ -x build/norm_ab ] || NORM_AB_NO_RUN=1 bash tools/norm_ab/run.sh "${NORM_BASE:-HEAD}" \
    > "$OUT/ncu-norm-build.log" 2>&1
  for k in ${NCU_NORM_KERNELS:-norm_fwd_rows2 norm_bwd_rows k_row_stats k_cast16 k_mx16 k_block}; do
    timeout 120 ncu --clock-control none -k regex:"$k" -c 2 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section InstructionStats \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active' \
      ./build/norm_ab /tmp/ncu-norm-ab.md > "$OUT/ncu-$k.txt" 2>&1
    note "ncu $k exit $?"
  done
fi
if has moe; then
  # MoE routing (lutra.moe): examples/train_moe.lua with GroupedLinear experts (bf16 on cuda)
  # eager, FP8 and as a CUDA graph, its linear reference mode,
  # and bench/moe_permute.lua (kernels against copy bandwidth, host cost against raw launches)
  for args in "--recipe none" "--recipe delayed" "--recipe mxfp8" "--recipe none --graph on" \
              "--recipe delayed --graph on" "--experts linear --recipe none"; do
    tag=$(echo "$args" | tr -d ' -')
    LUTRA_DEVICE=cuda luajit examples/train_moe.lua $args --every 200 > "$OUT/moe-$tag.log" 2>&1
    note "moe example $args: exit $? $(tail -1 "$OUT/moe-$tag.log")"
  done
  floors_lib "$OUT/moe-floors.log"
  timeout 240 luajit bench/moe_permute.lua --device cuda --floors-lib build/libhost_floors.so \
    --out "$OUT/moe_permute.md" > "$OUT/moe-bench.log" 2>&1
  note "moe permute bench exit $?"
fi
if has grouped; then
  # GroupedLinear (bench/grouped_bench.lua: host time against the raw launches, grouped GEMM
  # throughput against one dense GEMM of the same FLOPs) and PyTorch at the same shapes
  floors_lib "$OUT/grouped-floors.log"
  # the grouped GPU specs alone, with every NMSE printed (their margins)
  LUTRA_GPU_SPEC_VERBOSE=1 timeout 300 luajit /tmp/devkit/usr/bin/busted --pattern=_gpu \
    spec/gpu/grouped_linear_gpu.lua spec/gpu/grouped_paths_gpu.lua > "$OUT/grouped-specs.log" 2>&1
  note "grouped gpu specs: $(grep -E 'successes' "$OUT/grouped-specs.log" | tail -1)"
  # --part all: host time, GEMM throughput, and the FP8 forward taken apart (--part fp8)
  # (HF_REPLAY_LOG=1: each captured kernel's grid, shared memory, parameter bytes and cluster)
  HF_REPLAY_LOG=1 timeout 420 luajit bench/grouped_bench.lua --part all \
    --floors-lib build/libhost_floors.so > "$OUT/grouped-bench.log" 2>&1
  note "grouped bench exit $?"
  # the FP8 forward's kernels one by one, where Nsight Systems is installed
  if command -v nsys > /dev/null; then
    timeout 300 nsys profile -o /tmp/grouped_fp8 --force-overwrite true --stats=true \
      luajit bench/grouped_bench.lua --part fp8 --quick > "$OUT/grouped-nsys.log" 2>&1
    note "grouped fp8 nsys exit $?"
  fi
  timeout 200 python3 bench/torch_grouped.py > "$OUT/torch-grouped.log" 2>&1
  note "torch grouped bench exit $?"
fi
if has grouped-quant; then
  # issue 43's weight quantization and training step: the quantization's time against a device
  # copy (bench/probes/grouped_weight_quant.lua), each kernel's time and DRAM bytes (ncu), and
  # the step bf16 against FP8 (bench/grouped_bench.lua --part step)
  for s in "64 1024 4096" "8 4096 4096" "64 4096 4096"; do
    timeout 90 luajit bench/probes/grouped_weight_quant.lua $s >> "$OUT/grouped-quant.md" 2>&1
  done
  note "grouped quant: $(grep -c '^| [0-9]' "$OUT/grouped-quant.md") rows"
  summary+=("$(grep '^| [0-9]' "$OUT/grouped-quant.md")")
  NCU=1 timeout 120 ncu --clock-control none -k regex:"k_amax|k_cast" --metrics \
    gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    luajit bench/probes/grouped_weight_quant.lua 64 1024 4096 > "$OUT/grouped-quant-ncu.txt" 2>&1
  note "grouped quant ncu exit $?"
  for m in bf16 delayed; do # the step's kernels, 64 experts of 4096 -> 4096 (two steps each)
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
      luajit bench/probes/grouped_step_kernels.lua $m > "$OUT/grouped-step-kernels-$m.txt" 2>&1
    note "grouped step kernels ($m) exit $?"
  done
  timeout 200 luajit bench/grouped_bench.lua --part step > "$OUT/grouped-step.md" 2>&1
  note "grouped step exit $?"
  summary+=("$(grep '^| [0-9]' "$OUT/grouped-step.md")")
fi
if has grouped-profile; then
  # where a GroupedLinear forward's host time goes (bench/profile_grouped.lua under gperftools'
  # CPU profiler; the kit holds it when made with DEVKIT_EXTRA="libgoogle-perftools4
  # libtcmalloc-minimal4 libunwind8 google-perftools"), then the grouped host bench with the
  # splits in one device tensor (--ring 1) beside the ring of 16
  CPUPROFILE_FREQUENCY=4000 timeout 120 luajit bench/profile_grouped.lua "$OUT/grouped" 8 \
    > "$OUT/grouped-profile.log" 2>&1
  note "grouped profile exit $?: $(grep -c forward "$OUT/grouped-profile.log") figures"
  for m in bf16 delayed; do
    timeout 60 perl /tmp/devkit/usr/bin/google-pprof --text /tmp/devkit/usr/bin/luajit \
      "$OUT/grouped-$m.prof" > "$OUT/grouped-$m-pprof.txt" 2>&1
  done
  floors_lib "$OUT/grouped-floors.log"
  for ring in ${GROUPED_RINGS:-1 16}; do
    timeout 200 luajit bench/grouped_bench.lua --part host --ring $ring \
      --floors-lib build/libhost_floors.so > "$OUT/grouped-host-ring$ring.txt" 2>&1
    note "grouped host bench (ring $ring) exit $?"
  done
fi
if has dist; then
  # process groups on one GPU (1-rank NCCL): parallel Linear host time beside Linear + the raw
  # collective, collectives per step, SP all-gather bytes
  NCCL_NVLS_ENABLE=0 timeout 200 luajit bench/dist_overhead.lua --device cuda > "$OUT/dist-bench.log" 2>&1
  note "dist bench exit $?"
fi
if has prenorm; then
  for r in none delayed current mxfp8 block; do
    LUTRA_DEVICE=cuda timeout 120 luajit examples/train_prenorm.lua --device cuda --recipe $r > "$OUT/prenorm-$r.log" 2>&1
    note "prenorm example $r: exit $? $(tail -1 "$OUT/prenorm-$r.log")"
  done
fi
if has gpt; then
  # the GPT figures (issue 42): lutra's steps, PyTorch's builds and the bf16 loss parity, one
  # machine; LUTRA_DATA must hold the corpus (build/data/shakespeare.txt, carried)
  timeout 240 luajit bench/gpt_bench.lua --configs small,gpt2 --recipes none,delayed,delayed+head \
    --builds graph --warmup 3 --steps 10 --reps 5 > "$OUT/gpt-lutra.md" 2>&1
  note "gpt bench exit $?"
  timeout 300 python3 bench/gpt_torch.py --configs small,gpt2 --builds compile,compile-cg \
    --warmup 3 > "$OUT/gpt-torch.md" 2>&1
  note "gpt torch exit $?"
  timeout 100 luajit bench/gpt_parity.lua --dir /tmp/gpt-parity --steps 300 \
    > "$OUT/gpt-parity.log" 2>&1 &&
    timeout 120 python3 bench/gpt_torch.py --parity /tmp/gpt-parity >> "$OUT/gpt-parity.log" 2>&1
  note "gpt parity exit $?: $(tail -1 "$OUT/gpt-parity.log")"
  timeout 150 luajit bench/gpt_bench.lua --breakdown gpt2 --recipes none,delayed,delayed+head \
    > "$OUT/gpt-breakdown.md" 2>&1
  note "gpt breakdown exit $?"
fi
if has gpt-profile; then
  # one eager GPT-2 step's GPU time per kernel, bf16 beside FP8 delayed (Nsight Compute); the
  # one-step runs are subtracted: what is left is the second step's alone, set-up's kernels out
  for r in none delayed; do
    for n in 1 2; do
      timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        luajit bench/gpt_profile.lua --config gpt2 --recipe $r --steps $n \
        > "$OUT/gpt-kernels-$r-$n.csv" 2> "$OUT/gpt-kernels-$r-$n.err"
      note "gpt profile $r ($n steps) exit $?"
    done
  done
  python3 bench/ncu_kernels.py --steps 2 "$OUT/gpt-kernels-none-2.csv" \
    "$OUT/gpt-kernels-delayed-2.csv" --base "$OUT/gpt-kernels-none-1.csv" \
    "$OUT/gpt-kernels-delayed-1.csv" --base-steps 1 > "$OUT/gpt-kernels.md" 2>&1
  summary+=("$(cat "$OUT/gpt-kernels.md")")
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
cp "$OUT/summary.txt" "$FINAL_OUT/summary.txt"
tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . 2> /dev/null
