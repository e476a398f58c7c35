-- The pre-norm residual MLP block written in Lua that the Lua-module specs share (README's
-- example): y = x + f(x) with f = LayerNorm, Linear, GELU, Linear; dx = dy + f'(dy). Outputs in
-- self:buffer (no allocation per step). Block(d, h, {seed =, device =}); forward remembers the
-- options it was given (seen_opts). Not a spec itself (no _spec in its name).
local lutra = require("lutra")
local nn = lutra.nn

local Block = nn.Module("ResidualMLP")
function Block:init(d, h, opts)
  opts = opts or {}
  local seed, device = opts.seed or 1, opts.device
  self.f = self:add(nn.Sequential(nn.LayerNorm(d, { device = device }),
                                  nn.Linear(d, h, { seed = seed, device = device }), nn.GELU(),
                                  nn.Linear(h, d, { seed = seed + 1, device = device })))
end
function Block:forward(x, opts)
  self.seen_opts = opts
  return lutra.add(x, self.f:forward(x, opts), self:buffer("y", x))
end
function Block:backward(dy, input_grad)
  local df = self.f:backward(dy, input_grad)
  if input_grad == false then return nil end
  return lutra.add(dy, df, self:buffer("dx", dy))
end

return Block
