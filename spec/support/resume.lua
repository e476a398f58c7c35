-- Runs spec/support/resume_run.lua in fresh luajit processes (spec/checkpoint_resume_spec.lua
-- and spec/gpu/checkpoint_gpu.lua): a straight run of 2N steps, and N steps + save followed by
-- a new process that loads and takes N more. Returns the two runs' final state files' bytes and
-- their printed losses.
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local RUN = "spec/support/resume_run.lua"

local M = {}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
M.read = read

local function run(device, ...)
  local args = { ... }
  local cmd = string.format("RESUME_DEVICE=%s %s %s %s 2>&1", device, LUAJIT, RUN,
                            table.concat(args, " "))
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
end

local function losses(out)
  local t = {}
  for v in out:gmatch("%d+ (%S+)\n") do t[#t + 1] = v end
  return t
end

-- {straight = bytes, resumed = bytes, straight_losses = {...}, resumed_losses = {...}}
function M.compare(device, recipe, dtype, optim, n, skip)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir) == 0)
  local ckpt, s, f, r = dir .. "/ckpt.st", dir .. "/straight.st", dir .. "/first.st",
                        dir .. "/resumed.st"
  local out_s = run(device, "straight", recipe, dtype, optim, 2 * n, ckpt, s)
  local out_f = run(device, "first", recipe, dtype, optim, n, ckpt, f)
  local out_r = run(device, "second", recipe, dtype, optim, n, ckpt, r, skip or "")
  local res = {}
  local ok, err = pcall(function()
    res.straight, res.resumed = read(s), read(r)
  end)
  if not ok then
    error(string.format("a run failed (%s):\n%s\n%s\n%s", err, out_s, out_f, out_r), 2)
  end
  res.straight_losses = losses(out_s)
  local l = losses(out_f)
  for _, v in ipairs(losses(out_r)) do l[#l + 1] = v end
  res.resumed_losses = l
  os.execute("rm -rf " .. dir)
  return res
end

-- the premise of the comparison: two straight runs of the same steps write the same bytes
function M.straight_twice(device, recipe, dtype, optim, n)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir) == 0)
  local a, b = dir .. "/a.st", dir .. "/b.st"
  local out_a = run(device, "straight", recipe, dtype, optim, n, dir .. "/c.st", a)
  local out_b = run(device, "straight", recipe, dtype, optim, n, dir .. "/c.st", b)
  local ok, ra, rb = pcall(function() return read(a), read(b) end)
  os.execute("rm -rf " .. dir)
  if not ok then error("a run failed:\n" .. out_a .. "\n" .. out_b, 2) end
  return ra, rb
end

return M
