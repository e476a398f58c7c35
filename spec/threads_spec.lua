-- Threads on the cpu backend: 2 and 4 threads training their own FP8 models at once (every
-- recipe) match one thread alone bit for bit, and per-thread caches are released at thread exit
-- (spec/native/threads_check.c, built with the system compiler; skipped with a message without
-- one).
-- spec/gpu/threads_gpu.lua runs the same driver on cuda.
local T = require("spec.support.threads_check")

describe("threads (cpu)", function()
  local exe, why = T.build()
  if not exe then
    pending("skipped: " .. why)
    return
  end
  it("2 and 4 threads train their own models as one thread alone, and free their caches", function()
    local out, ok = T.run(exe, "cpu", 3)
    T.assert_passed(out, ok, 34, "cpu")
  end)
end)
