-- NVTX ranges are switched on by LUTRA_NVTX=1 at load time only (read once), and a training
-- step runs the same with them on. Each case runs in its own LuaJIT process, since the switch
-- is read when the library loads.
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local SCRIPT = [[
local lutra = require("lutra")
local nn = lutra.nn
local net = nn.Sequential(nn.Linear(32, 32, {seed = 1}), nn.GELU(), nn.Linear(32, 32, {seed = 2}))
local x = lutra.tensor({32, 32}):randn(3)
local t = lutra.tensor({32, 32}):randn(4)
local loss = nn.MSELoss()
local opt = lutra.optim.SGD(net, {lr = 0.1})
local fp8 = lutra.autocast{recipe = lutra.recipe.delayed{amax_history_len = 4}}
for _ = 1, 5 do
  fp8:run(function() loss:forward(net:forward(x), t) end)
  net:backward(loss:backward())
  opt:step()
end
io.write(tostring(lutra.nvtx_active()), " ", string.format("%.9g", loss:value()), "\n")
]]

local function run(env)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(SCRIPT)
  f:close()
  local p = assert(io.popen(string.format("%s %s 2>&1", env .. " " .. LUAJIT, path)))
  local out = p:read("*a")
  p:close()
  os.remove(path)
  local active, value = out:match("^(%a+) (%S+)")
  assert(active, "the script failed:\n" .. out)
  return active == "true", tonumber(value)
end

describe("NVTX switch", function()
  it("is read from LUTRA_NVTX at load and changes no result", function()
    local off, loss_off = run("LUTRA_NVTX=0")
    local on, loss_on = run("LUTRA_NVTX=1")
    local unset = run("env -u LUTRA_NVTX")
    assert.is_false(off)
    assert.is_true(on)
    assert.is_false(unset)
    assert.are.equal(loss_off, loss_on)
  end)
end)
