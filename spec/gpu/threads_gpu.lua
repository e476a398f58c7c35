-- Threads on cuda: 2 and 4 threads training their own FP8 models at once (every recipe, the
-- block recipe included), each on its own stream, match one thread alone bit for bit, with the
-- one-GEMM graphs on (captures on one thread's stream while others issue work) and off
-- (LUTRA_GEMM_GRAPHS=0: the plain cuBLASLt calls, workspaces and reduction scratch per stream);
-- every thread's stream, scratch and plans are released at its exit (its cuBLASLt handle goes
-- back to a list for the next thread: cublasLtDestroy's context-wide wait crashed the driver
-- while another thread captured).
-- spec/native/threads_check.c, built with the system compiler against ./liblutra.so.
local S = require("spec.gpu.support")
local T = require("spec.support.threads_check")

describe("threads (" .. S.DEV .. ")", function()
  local exe, why
  local function driver()
    if not exe then
      exe, why = T.build()
      if not exe then error("cannot build spec/native/threads_check.c: " .. why, 0) end
    end
    return exe
  end
  for _, graphs in ipairs { "1", "0" } do
    S.test(it, "LUTRA_GEMM_GRAPHS=" .. graphs .. ": 2 and 4 threads match one alone, caches freed",
           function()
      local out, ok = T.run(driver(), S.DEV, 6, "LUTRA_GEMM_GRAPHS=" .. graphs)
      local n = T.assert_passed(out, ok, 34, S.DEV .. ", LUTRA_GEMM_GRAPHS=" .. graphs)
      S.note("threads_check (%s, graphs %s): %d checks passed", S.DEV, graphs, n)
    end)
  end
end)
