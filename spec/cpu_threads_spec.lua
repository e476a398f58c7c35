-- The CPU backend's GEMM threads (lutra_cpu_threads, LUTRA_CPU_THREADS; lutra/base.h): one by
-- default, since OpenBLAS's threaded GEMM allocates per call (the engine example's promise of no
-- allocation per step); the environment variable read at load, a bad value falling back to the
-- default, and lutra_cpu_set_threads refusing a negative count without changing the setting.
-- Each case loads the library in a fresh LuaJIT, with the environment the case names.
local sh = require("spec.support.shell").sh

local function threads_with(env)
  local script = [[local C = require('lutra.core').C; io.write(tonumber(C.lutra_cpu_threads()))]]
  local ok, out = sh("env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u LUTRA_CPU_THREADS " .. env ..
                     " LUA_PATH='lua/?.lua;lua/?/init.lua;;' ${LUAJIT:-luajit} -e \"" .. script .. "\"")
  assert(ok, out)
  return tonumber(out:match("(%d+)$"))
end

describe("the CPU backend's GEMM threads", function()
  local core = require("lutra.core")
  local C = core.C

  it("are one when the environment says nothing", function()
    assert.are.equal(1, threads_with(""))
  end)

  it("follow LUTRA_CPU_THREADS, and a value that is not a count keeps the default", function()
    assert.are.equal(3, threads_with("LUTRA_CPU_THREADS=3"))
    assert.are.equal(1, threads_with("LUTRA_CPU_THREADS=three"))
    assert.are.equal(1, threads_with("LUTRA_CPU_THREADS=-2"))
    -- 0: OpenBLAS's own setting, here what OPENBLAS_NUM_THREADS asks of it (OpenBLAS caps it
    -- at the cores this process may use)
    local _, cores = sh("nproc")
    assert.are.equal(math.min(2, tonumber(cores:match("%d+"))),
                     threads_with("LUTRA_CPU_THREADS=0 OPENBLAS_NUM_THREADS=2"))
  end)

  it("change with lutra_cpu_set_threads, which refuses a negative count and changes nothing", function()
    local before = tonumber(C.lutra_cpu_threads())
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_cpu_set_threads(-1))
    assert.matches("lutra_cpu_set_threads: thread count %-1 is negative", core.ffi.string(C.lutra_last_error()))
    assert.are.equal(before, tonumber(C.lutra_cpu_threads()))
    assert.are.equal(C.LUTRA_OK, C.lutra_cpu_set_threads(2))
    assert.are.equal(2, tonumber(C.lutra_cpu_threads()))
    assert.are.equal(C.LUTRA_OK, C.lutra_cpu_set_threads(before))
    assert.are.equal(before, tonumber(C.lutra_cpu_threads()))
  end)
end)
