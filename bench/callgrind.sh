#!/usr/bin/env bash
# Instruction counts (valgrind callgrind, Ir) of lutra's host-side work on the CPU backend: a
# figure of the front's overhead that any machine without a GPU repeats exactly, so that
# regressions show without one.
#   bash bench/callgrind.sh [--rev REV] [--out FILE]
# It builds a CPU-only liblutra.so (make CUDA=0) from a copy of the working tree's Makefile,
# src/, tools/ and lua/ (or of commit REV) in a temporary directory, so the tree's own
# liblutra.so and build/ are left alone, then runs small LuaJIT loops under callgrind:
#   autocast   enter+exit pairs of a delayed-recipe scope from Lua (scope:enter() scope:exit())
#   linear     forward of nn.Linear(64, 64, {bias = false}), f32, x [64, 64], CPU backend
#   grouped    forward of nn.GroupedLinear(8, 64, 64, {bias = false}), f32, x [128, 64], 16 rows
#              an expert given as an i32 tensor (the device splits' path), CPU backend
#   grouped64  the same with 64 experts (x [1024, 64]) under a delayed-scaling scope (enter,
#              forward, exit), bf16
# Each loop runs twice, N and 2N iterations; a figure is (Ir(2N) - Ir(N)) / N, which drops
# start-up, JIT compilation and first-call costs (plans, buffers). Figures:
#   autocast_pair_lua    whole program per pair: Lua methods, FFI calls and C (JIT on)
#   autocast_pair_c      inclusive Ir of lutra_autocast_enter + lutra_autocast_exit per pair
#   linear_fwd_c_nogemm  inclusive Ir of lutra_module_forward_ex minus that of cblas_sgemm, per
#                        forward: lutra's C work around the GEMM (checks, plan lookup, buffers)
#   linear_fwd_gemm      inclusive Ir of cblas_sgemm per forward (OpenBLAS; for reference)
#   grouped_fwd_c_nogemm inclusive Ir of lutra_grouped_forward minus that of
#                        lutra_cpu_grouped_gemm, per forward: GroupedLinear's C work around its
#                        one grouped GEMM (checks, the splits' hold, plan, buffers; the CUDA
#                        build's launch code differs below the backend call)
#   grouped64_note       inclusive Ir of lutra_autocast_note_forward(_n) per delayed forward of 64
#                        experts: the scale metas it registers for the scope's update, one call
#                        a meta (backend-independent; the CUDA update's key is built from them)
# The C-side figures are collected only inside the named functions (--toggle-collect) and are
# exact: the same on every run of the same build. The whole-program figure varies by about
# +-0.05 per pair between runs (LuaJIT's start-up depends on addresses), N being 10^6.
# LuaJIT runs with its JIT on (the path a training loop takes); OPENBLAS_NUM_THREADS=1.
# Output: "callgrind <name> <Ir per call>" lines, then a markdown table (also to FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

REV="" OUT_FILE=""
while [ $# -gt 0 ]; do
  case $1 in
  --rev) REV=$2; shift 2 ;;
  --out) OUT_FILE=$2; shift 2 ;;
  *) echo "usage: bash bench/callgrind.sh [--rev REV] [--out FILE]" >&2; exit 2 ;;
  esac
done
command -v valgrind > /dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }
LUAJIT=${LUAJIT:-luajit}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -n "$REV" ]; then
  git archive "$REV" Makefile src tools lua | tar -x -C "$TMP"
  SOURCE="commit $(git rev-parse --short "$REV")"
else
  cp -r Makefile src tools lua "$TMP"/
  rm -f "$TMP/lua/lutra/cdef.lua" # regenerated from the copied header
  SOURCE="working tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- Makefile src tools lua || echo ' + local changes')"
fi
echo "== building a CPU-only liblutra.so in $TMP (make CUDA=0)"
make -s -C "$TMP" CUDA=0 -j"$(nproc)" > "$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; exit 1; }

cat > "$TMP/loop.lua" << 'EOF'
local what, n = arg[1], tonumber(arg[2])
local lutra = require("lutra")
if what == "autocast" then
  local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
  for _ = 1, n do scope:enter() scope:exit() end
elseif what == "linear" then
  local lin = lutra.nn.Linear(64, 64, { bias = false })
  local x = lutra.tensor({ 64, 64 }):randn(1)
  lin:forward(x)
  for _ = 1, n do lin:forward(x) end
elseif what == "grouped64" then
  local g = lutra.nn.GroupedLinear(64, 64, 64, { bias = false, dtype = "bf16" })
  local x = lutra.tensor({ 1024, 64 }, "bf16"):randn(1)
  local s = {}
  for e = 1, 64 do s[e] = 16 end
  local splits = lutra.from_table(s, { 64 }, "i32")
  local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
  for _ = 1, n + 1 do
    scope:enter()
    g:forward(x, splits)
    scope:exit()
  end
elseif what == "grouped" then
  local g = lutra.nn.GroupedLinear(8, 64, 64, { bias = false })
  local x = lutra.tensor({ 128, 64 }):randn(1)
  local splits = lutra.from_table({ 16, 16, 16, 16, 16, 16, 16, 16 }, { 8 }, "i32")
  g:forward(x, splits)
  for _ = 1, n do g:forward(x, splits) end
else
  error("unknown loop " .. tostring(what))
end
EOF

export LUTRA_LIB="$TMP/liblutra.so" LUTRA_DEVICE=cpu OPENBLAS_NUM_THREADS=1
export LUA_PATH="$TMP/lua/?.lua;$TMP/lua/?/init.lua;;"

# Ir collected by one callgrind run: ir LOOP N [valgrind options...]
ir() {
  local loop=$1 n=$2
  shift 2
  local log="$TMP/cg-$loop-$n-$#.log"
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" \
    "$LUAJIT" "$TMP/loop.lua" "$loop" "$n" > "$log" 2>&1 || { cat "$log" >&2; return 1; }
  grep -oP 'Collected : \K[0-9]+' "$log"
}
# per-iteration Ir from runs of N and 2N: per LOOP N [valgrind options...]
per() {
  local loop=$1 n=$2
  shift 2
  local a b
  a=$(ir "$loop" "$n" "$@")
  b=$(ir "$loop" $((2 * n)) "$@")
  awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.2f", (b - a) / n }'
}

echo "== callgrind runs (about two minutes)"
autocast_lua=$(per autocast 1000000)
autocast_c=$(per autocast 100000 --toggle-collect=lutra_autocast_enter \
  --toggle-collect=lutra_autocast_exit)
linear_fwd=$(per linear 1000 --toggle-collect=lutra_module_forward_ex)
linear_gemm=$(per linear 1000 --toggle-collect=cblas_sgemm)
linear_nogemm=$(awk -v f="$linear_fwd" -v g="$linear_gemm" 'BEGIN { printf "%.2f", f - g }')
grouped_fwd=$(per grouped 1000 --toggle-collect=lutra_grouped_forward)
grouped_gemm=$(per grouped 1000 --toggle-collect=lutra_cpu_grouped_gemm)
grouped_nogemm=$(awk -v f="$grouped_fwd" -v g="$grouped_gemm" 'BEGIN { printf "%.2f", f - g }')
grouped64_note=$(per grouped64 100 --toggle-collect=lutra_autocast_note_forward \
  --toggle-collect=lutra_autocast_note_forward_n)

echo "callgrind autocast_pair_lua $autocast_lua"
echo "callgrind autocast_pair_c $autocast_c"
echo "callgrind linear_fwd_c_nogemm $linear_nogemm"
echo "callgrind linear_fwd_gemm $linear_gemm"
echo "callgrind grouped_fwd_c_nogemm $grouped_nogemm"
echo "callgrind grouped64_note $grouped64_note"

TABLE=$(cat << EOF
- Source: $SOURCE, built with \`make CUDA=0\` ($(${CC:-cc} --version | head -1), CFLAGS -O2 -g)
- Tools: $(valgrind --version), $("$LUAJIT" -v | cut -d' ' -f1-2) (JIT on), OPENBLAS_NUM_THREADS=1
- Command: \`bash bench/callgrind.sh\`; per call = (Ir of 2N iterations - Ir of N) / N

| what | Ir per call |
|---|---:|
| autocast enter+exit from Lua (scope:enter() scope:exit(), whole program) | $autocast_lua |
| autocast enter+exit, C side (lutra_autocast_enter + lutra_autocast_exit, inclusive) | $autocast_c |
| Linear forward f32 64x64 -> 64, CPU: lutra_module_forward_ex minus cblas_sgemm (inclusive) | $linear_nogemm |
| (the cblas_sgemm of that forward, OpenBLAS) | $linear_gemm |
| GroupedLinear forward f32, 8 experts x 16 rows of 64 -> 64, i32 splits tensor, CPU: lutra_grouped_forward minus lutra_cpu_grouped_gemm (inclusive) | $grouped_nogemm |
| GroupedLinear forward bf16, 64 experts, delayed scaling: lutra_autocast_note_forward and _forward_n (inclusive, all their calls) | $grouped64_note |
EOF
)
echo
echo "$TABLE"
if [ -n "$OUT_FILE" ]; then
  echo "$TABLE" > "$OUT_FILE"
  echo "(written to $OUT_FILE)"
fi
