-- One process of the resume specs (spec/checkpoint_resume_spec.lua, spec/gpu/checkpoint_gpu.lua):
--   luajit resume_run.lua PHASE RECIPE DTYPE OPTIM STEPS CKPT OUT [SKIP]
-- PHASE straight: STEPS steps from a fresh start; first: STEPS steps, then save CKPT; second:
-- fresh objects, load CKPT, STEPS steps. Every phase ends by saving its whole state to OUT (the
-- resumed run and the straight one must write the same bytes) and prints each step's loss as a
-- hex float. The data of each step is drawn from the global generator, so the generator's state
-- is part of what a resume must restore. SKIP (second only) leaves one part out of the load
-- ("rng", "optim" or "fp8"): the spec's control that a resume missing state does differ.
local lutra = require("lutra")
local phase, recipe_name, dtype, optim_kind, steps, ckpt, out, skip = unpack(arg)
steps = tonumber(steps)
local device = os.getenv("RESUME_DEVICE") or lutra.default_device

local recipes = {
  none = function() return nil end,
  delayed = function() return lutra.recipe.delayed{ amax_history_len = 4 } end,
  current = function() return lutra.recipe.current{} end,
  mxfp8 = function() return lutra.recipe.mxfp8{} end,
  block = function() return lutra.recipe.block{} end,
  -- stochastic rounding of grad_output (the default): each quantization draws its seed from the
  -- quantizer's count of quantizations, which the checkpoint must carry
  nvfp4 = function() return lutra.recipe.nvfp4{} end,
}
local recipe = recipes[recipe_name]()

lutra.manual_seed(20261201)
local nn = lutra.nn
local opts = { dtype = dtype, device = device }
-- RESUME_MODEL picks the model (every module kind's checkpoint entry is exercised by one):
--   mlp      Linear -> GELU -> Linear
--   prenorm  Residual(LayerNormMLP swiglu, RMSNorm) -> RMSNorm -> Linear head
--   lnl      LayerNormLinear -> GELU -> Linear
--   grouped  GroupedLinear of 4 experts, each its own share of the rows (per-expert amaxes)
local H = 128
local models = {
  mlp = function() return nn.Sequential(nn.Linear(H, H, opts), nn.GELU(), nn.Linear(H, H, opts)) end,
  prenorm = function()
    return nn.Sequential(
      nn.Residual(nn.LayerNormMLP(H, 64, { normalization = "RMSNorm", activation = "swiglu",
                                           dtype = dtype, device = device })),
      nn.RMSNorm(H, opts), nn.Linear(H, H, opts))
  end,
  lnl = function()
    return nn.Sequential(nn.LayerNormLinear(H, H, opts), nn.GELU(), nn.Linear(H, H, opts))
  end,
  grouped = function() return nn.GroupedLinear(4, H, H, opts) end,
}
local model_name = os.getenv("RESUME_MODEL") or "mlp"
local net = assert(models[model_name], "unknown RESUME_MODEL " .. model_name)()
-- the experts' rows: unequal, so each expert's amax (and history) is its own
local splits = model_name == "grouped" and { 4, 12, 8, 8 } or nil
local function forward(x)
  if splits then return net:forward(x, splits) end
  return net:forward(x)
end
local opt = optim_kind == "adamw" and lutra.optim.AdamW(net, { lr = 1e-2, weight_decay = 0.01 })
  or lutra.optim.SGD(net, { lr = 0.05, momentum = 0.9 })
local scope = recipe and lutra.autocast{ recipe = recipe } or nil
local loss = nn.MSELoss()
local x = lutra.tensor({ 32, 128 }, dtype, device)
local target = lutra.tensor({ 32, 128 }, dtype, device)

if phase == "second" then
  local objects = { model = net, optim = opt, rng = true, recipe = recipe }
  if skip == "rng" then objects.rng = nil end
  if skip == "optim" then objects.optim = nil end
  if skip == "fp8" then objects.fp8 = false end
  lutra.load(ckpt, objects)
end

for step = 1, steps do
  x:randn()
  target:uniform(nil, -1, 1)
  if scope then scope:enter() end
  loss:forward(forward(x), target)
  net:backward(loss:backward(), false)
  if scope then scope:exit() end
  opt:step()
  io.write(string.format("%d %a\n", step, loss:value()))
end

if phase == "first" then lutra.save(ckpt, { model = net, optim = opt, rng = true }) end
lutra.save(out, { model = net, optim = opt, rng = true })
