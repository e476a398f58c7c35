-- Run by spec/dist_spec.lua under mpirun: every rank trains a step in a loop with an all-reduce
-- per step; the last rank kills itself (SIGKILL) mid-loop. The others must fail with an error
-- (printed as "DIST-ERROR <message>") within the timeout, then end the job (lutra.dist.abort).
local lutra = require("lutra")
local ffi = require("ffi")
ffi.cdef("int kill(int pid, int sig); int getpid(void);")
lutra.dist.init({ timeout = tonumber(os.getenv("KILL_TIMEOUT") or "5") })
local w = lutra.dist.world()
local t = lutra.tensor({ 256 }, "f32")
local t0 = lutra.now()
for step = 1, 1000 do
  if step == 20 and w:rank() == w:size() - 1 then
    io.stdout:write("DIST-KILLED rank ", w:rank(), "\n")
    io.stdout:flush()
    ffi.C.kill(ffi.C.getpid(), 9)
  end
  t:fill(step)
  local ok, err = pcall(w.all_reduce, w, t, "sum")
  if not ok then
    io.stdout:write(string.format("DIST-ERROR rank %d step %d after %.2f s: %s\n", w:rank(), step,
                                  lutra.now() - t0, err))
    io.stdout:flush()
    lutra.dist.abort(3)
  end
end
io.stdout:write("DIST-NOERROR rank ", w:rank(), "\n")
