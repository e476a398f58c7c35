-- The training script examples/embed/host.c runs: loaded once with luaL_dofile, it returns
-- {init =, step =}. init(x, target) receives the host's two lutra tensors (light userdata:
-- lutra_tensor pointers the host owns and keeps alive) and builds the model; step(frame,
-- fault) runs one training step on what the host copied into them this frame and returns the
-- loss. fault = true makes this step fail inside its autocast scope, as a script bug would
-- (a forward on a tensor of the wrong width): the host must recover from that.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn

local S = {}
local net, mse, opt, fp8, x, target, wrong

function S.init(x_ptr, target_ptr)
  x = ffi.cast("lutra_tensor *", x_ptr)
  target = ffi.cast("lutra_tensor *", target_ptr)
  local width = x:dims()[2]
  lutra.manual_seed(7)
  net = nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Linear(64, width))
  mse = nn.MSELoss()
  opt = lutra.optim.AdamW(net, { lr = 3e-3 })
  fp8 = lutra.autocast { recipe = lutra.recipe.current {} }
  wrong = lutra.tensor({ x:dims()[1], width + 1 })
end

function S.step(frame, fault)
  fp8:enter() -- not :run(): an error below leaves the scope entered, and the host unwinds it
  local y = net:forward(fault and wrong or x)
  fp8:exit()
  mse:forward(y, target)
  net:backward(mse:backward(), false)
  opt:step()
  return mse:value()
end

return S
