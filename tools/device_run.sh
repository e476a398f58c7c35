#!/usr/bin/env bash
# The GPU machine's side of a call prepared by tools/device_pack.sh (and tools/te_pack): sets up
# the environment, unpacks the carried libraries, then runs the steps asked for, logs under
# $OUT/logs.tgz and one line a step in $OUT/summary.txt (also printed).
#   bash tools/device_run.sh STEP...        (from the repository root, on the GPU machine)
# Carry what the steps need: .dk (always), lua/lutra/cdef.lua, build/device-pack/NAME.tar.xz for
# each library named, libhost_floors.so and norm_throughput for the benches, .te and .whl for TE.
# The machine's /tmp outlives a call while it stays warm (30 s idle): a library or TE unpacked
# by an earlier call is reused, so a second call on a warm machine need not carry them again.
# Steps (NAME: a packed library, "head" or a short hash; "head" where none is named):
#   spec=FILE[,FILE...][@NAME]   busted on those spec files
#   suite[@NAME]                 the GPU suite (busted --pattern=_gpu spec/gpu), SUITE_TIMEOUT
#   norms=NAME[,NAME...]         norm_throughput 16384 4096, the libraries alternating, 3 rounds
#   grouped=NAME[,NAME...]       grouped_bench.lua --part fp8 --quick, alternating, 2 rounds
#   attn-host[@NAME]             attention_bench.lua --part host
#   gpt[@NAME]                   GPT-2 124M steps (gpt_bench.lua, graph: bf16, FP8 delayed, with
#                                the LM head in FP8 too, every layer and the head) beside
#                                gpt_torch.py's torch.compile builds, then the FP8 breakdowns
#   te-install                   TE into /tmp/site on cores 2-15 (in the background: the steps
#                                after it run on cores 0-1 until a te-* step waits for it)
#   te-host                      bench/te_transformer_host.py
#   te-norms                     TE's norm kernels (.te/te_kernels.py norms: the anchors'
#                                script, ../shared/anchors/te_kernels.py, copied into .te/)
#   te-cast                      tools/te_pack/te_cast_check.py
#   sh=FILE[@NAME]               bash FILE with this environment and NAME's library (LUTRA_LIB,
#                                ./liblutra.so); its output in sh-FILE.log, $LOGS exported for
#                                files of its own (a probe that no step above runs)
# Example: bash tools/device_run.sh spec=spec/gpu/fused_norm_gpu.lua norms=base,head suite
set -uo pipefail
OUT=${OUT:-/tmp/lutra-out}
LOGS=/tmp/device-run-logs
rm -rf "$LOGS"
mkdir -p "$LOGS" "$OUT" /tmp/libs
T0=$(date +%s)
summary() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$LOGS/summary.txt"; }

source .dk/enter.sh
# the kit's LuaJIT keeps its jit.* modules (for -jv) under its own prefix
export LUA_PATH="lua/?.lua;lua/?/init.lua;/tmp/devkit/usr/share/luajit-2.1.0-beta3/?.lua;$LUA_PATH"
LUTRA_CUDNN_PATH=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2> /dev/null)/lib
export LUTRA_CUDNN_PATH
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
BUSTED="luajit /tmp/devkit/usr/bin/busted -o plainTerminal"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$LOGS/gpu.txt" 2>&1
summary "gpu: $(cat "$LOGS/gpu.txt")"

for f in build/device-pack/*.tar.xz; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .tar.xz)
  rm -rf "/tmp/libs/$name"
  tar -C /tmp/libs -xJf "$f" && ln -sf liblutra.so "/tmp/libs/$name/liblutra.so.0"
done
mkdir -p build
[ -f build/device-pack/libhost_floors.so ] && cp build/device-pack/libhost_floors.so build/
lib() { # NAME -> the library's path (an error line where it is missing)
  [ -f "/tmp/libs/$1/liblutra.so" ] || { summary "library $1 missing (carry build/device-pack/$1.tar.xz)"; return 1; }
  echo "/tmp/libs/$1/liblutra.so"
}
# the specs that build a C driver against ./liblutra.so (spec/support/threads_check.lua) link
# the library under test there: ./liblutra.so(.0) links to it (a library built in this tree stays)
use() { # NAME: LUTRA_LIB and ./liblutra.so
  local p
  p=$(lib "$1") || return 1
  export LUTRA_LIB=$p
  if [ -L liblutra.so ] || [ ! -e liblutra.so ]; then
    ln -sf "$p" liblutra.so
    ln -sf "$p" liblutra.so.0 # the soname, which the driver loads through its rpath
  fi
}
passes() { grep -E 'successes' "$1" | tail -1; }
TE_PID=
te_wait() {
  [ -n "$TE_PID" ] && { wait "$TE_PID"; summary "te install rc=$?"; TE_PID=; }
  [ -d /tmp/site/transformer_engine ]
}

for step in "$@"; do
  arg=${step#*=}
  name=head
  case $step in *@*) name=${step##*@} arg=${arg%@*} ;; esac
  case $step in
    spec=*)
      use "$name" || continue
      for f in ${arg//,/ }; do
        log=$LOGS/$(basename "$f" .lua)-$name.log
        timeout 300 $BUSTED "$f" > "$log" 2>&1
        summary "$f ($name): $(passes "$log")"
      done ;;
    suite | suite@*)
      use "$name" || continue
      timeout "${SUITE_TIMEOUT:-420}" $BUSTED --pattern=_gpu spec/gpu > "$LOGS/suite-$name.log" 2>&1
      summary "GPU suite ($name): $(passes "$LOGS/suite-$name.log")" ;;
    norms=*)
      for round in 1 2 3; do
        for n in ${arg//,/ }; do
          lib "$n" > /dev/null || continue
          LD_LIBRARY_PATH=/tmp/libs/$n:$LD_LIBRARY_PATH timeout 120 \
            build/device-pack/norm_throughput 16384 4096 "$LOGS/norms-$n-$round.md" \
            > "$LOGS/norms-$n-$round.log" 2>&1 || summary "norms $n round $round failed"
        done
      done
      summary "norms written: $(ls "$LOGS" | grep -c '^norms-.*\.md$') tables" ;;
    grouped=*)
      for round in 1 2; do
        for n in ${arg//,/ }; do
          use "$n" || continue
          timeout 150 luajit bench/grouped_bench.lua --part fp8 --quick \
            > "$LOGS/grouped-$n-$round.log" 2>&1 || summary "grouped $n round $round failed"
        done
      done ;;
    attn-host | attn-host@*)
      use "$name" || continue
      timeout 150 luajit bench/attention_bench.lua --part host > "$LOGS/attn-host-$name.log" 2>&1
      summary "attention host ($name): rc $?" ;;
    sh=*)
      use "$name" || continue
      log=$LOGS/sh-$(basename "$arg" .sh).log
      LOGS=$LOGS timeout "${SH_TIMEOUT:-300}" bash "$arg" > "$log" 2>&1
      summary "sh $arg ($name): rc $?" ;;
    gpt | gpt@*)
      use "$name" || continue
      timeout 150 luajit bench/gpt_bench.lua --configs gpt2 --builds graph --warmup 3 --steps 10 \
        --reps 5 --recipes none,delayed,delayed+head,delayed+all > "$LOGS/gpt-$name.md" 2>&1
      summary "gpt bench ($name): rc $?"
      timeout 300 python3 bench/gpt_torch.py --configs gpt2 --builds compile,compile-cg --warmup 3 \
        > "$LOGS/gpt-torch.md" 2>&1
      summary "gpt torch: rc $?"
      timeout 150 luajit bench/gpt_bench.lua --breakdown gpt2 --recipes delayed,delayed+head \
        > "$LOGS/gpt-breakdown-$name.md" 2>&1
      summary "gpt breakdown ($name): rc $?" ;;
    te-install)
      if [ -d /tmp/site/transformer_engine ]; then summary "te: already installed"; else
        MAX_JOBS=14 taskset -c 2-15 bash tools/te_pack/install.sh "$LOGS/te-install.log" \
          > "$LOGS/te-install.out" 2>&1 &
        TE_PID=$!
        taskset -p -c 0-1 $$ > /dev/null
      fi ;;
    te-host)
      te_wait || { summary "te-host: TE not installed"; continue; }
      (cd bench && PYTHONPATH=/tmp/site timeout 150 python3 te_transformer_host.py) \
        > "$LOGS/te-host.log" 2>&1
      summary "te host: rc $?" ;;
    te-norms)
      te_wait || { summary "te-norms: TE not installed"; continue; }
      [ -f .te/te_kernels.py ] || { summary "te-norms: .te/te_kernels.py not carried"; continue; }
      PYTHONPATH=/tmp/site timeout 150 python3 .te/te_kernels.py norms > "$LOGS/te-norms.log" 2>&1
      summary "te norms: rc $?" ;;
    te-cast)
      te_wait || { summary "te-cast: TE not installed"; continue; }
      PYTHONPATH=/tmp/site timeout 120 python3 tools/te_pack/te_cast_check.py > "$LOGS/te-cast.log" 2>&1
      summary "te cast check: rc $?" ;;
    *) summary "unknown step: $step" ;;
  esac
done
te_wait > /dev/null
cp "$LOGS/summary.txt" "$OUT/"
tar -C "$LOGS" -czf "$OUT/logs.tgz" .
