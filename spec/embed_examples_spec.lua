-- The embedding examples on the cpu: examples/embed/frame_loop.c (a particle simulation that
-- trains on its own state one step per frame; no heap allocation per step after warm-up) and
-- examples/embed/host.c (LuaJIT embedded, a Lua training step per frame on tensors wrapping the
-- host's own arrays, a failing step recovered without an autocast scope left entered). Built with the system compiler against
-- ./liblutra.so, as make's examples/embed/* targets build them (not through make, which would
-- reconfigure the library), and run without LD_PRELOAD: frame_loop counts allocations by
-- interposing malloc, which a preloaded allocator (ASan's) would bypass.
local I = require("spec.support.install_tree")

local function cc()
  local c = os.getenv("CC")
  return (c and c ~= "") and c or "cc"
end

local FLAGS = "-std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc"

describe("examples/embed", function()
  if not io.open("liblutra.so", "rb") then
    pending("skipped: liblutra.so is not built (make)")
    return
  end

  it("frame_loop trains from the simulation's state with no allocation per step", function()
    local exe = "build/frame_loop_spec"
    local ok, out = I.sh(string.format("mkdir -p build && %s %s -o %s examples/embed/frame_loop.c " ..
                                       "-L. -llutra -Wl,-rpath,\"$PWD\" -lm", cc(), FLAGS, exe))
    assert(ok, "building frame_loop failed:\n" .. out)
    -- as README runs it: OpenBLAS's and lutra's thread settings as a fresh shell has them
    -- (OpenBLAS's threaded GEMM allocates per call; the CPU backend keeps one thread by default)
    ok, out = I.sh("env -u LD_PRELOAD -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u LUTRA_CPU_THREADS " ..
                   "LUTRA_DEVICE=cpu " .. exe .. " 300")
    assert(ok, out)
    assert.is_nil(out:find("FAIL", 1, true), out)
    -- zero after warm-up, and the counter did count: warm-up allocates the buffers and plans
    local per_step, total, before = out:match(
      "allocations per step: (%d+) %((%d+) heap allocations over frames 21..300, (%d+) before them")
    assert(per_step, out)
    assert.are.equal("0", per_step)
    assert.are.equal("0", total)
    assert.is_true(tonumber(before) > 0, "the allocation counter saw nothing:\n" .. out)
    local first, last = out:match("loss: ([%d.]+) over the first 10 frames, ([%d.]+) over the last")
    assert(first and tonumber(last) < 0.1 * tonumber(first), out)
    assert(out:find("frame budget 16.7 ms %(60 Hz%): training step mean [%d.]+ ms, max [%d.]+ ms"), out)
  end)

  it("host runs a Lua step per frame and recovers a failing one without a scope left entered", function()
    local lj, why = I.luajit_flags()
    if not lj then
      pending(why)
      return
    end
    local exe = "build/embed_host_spec"
    local ok, out = I.sh(string.format("mkdir -p build && %s %s -o %s examples/embed/host.c " ..
                                       "-L. -llutra -Wl,-rpath,\"$PWD\" %s -lm", cc(), FLAGS, exe,
                                       lj))
    assert(ok, "building host failed:\n" .. out)
    ok, out = I.sh("env -u LD_PRELOAD OPENBLAS_NUM_THREADS=1 LUA_PATH='lua/?.lua;lua/?/init.lua' " ..
                   exe .. " 300 examples/embed/train_step.lua")
    assert(ok, out)
    assert.is_nil(out:find("FAIL", 1, true), out)
    -- the script's tensors are lutra_tensor_wrap views of the host's arrays, not copies
    assert(out:find("inputs: the host's own buffers, wrapped (no copy per frame)", 1, true), out)
    assert(out:find("frame 150: the script failed at autocast depth 1: [^\n]*lutra_linear_forward: " ..
                    "input has 17 features"), out)
    assert(out:find("frame 150: unwound the autocast scopes to depth 0", 1, true), out)
    assert(out:find("1 failed step%(s%), 1 recovered; autocast depth at the end 0"), out)
    local first, last = out:match("loss: ([%d.]+) over the first 10 frames, ([%d.]+) over the last")
    assert(first and tonumber(last) < 0.2 * tonumber(first), out)
  end)
end)
