-- Exact resume, swept (CPU backend): for every module kind x every recipe the CPU runs x the
-- optimizer settings, N steps, save {model, optim, rng}, load into objects built afresh (the
-- same way, after another manual_seed: other weights, other dropout seeds), M more steps must
-- equal N + M steps straight bit for bit: every step's loss, and the final checkpoint files of
-- both runs byte for byte (every parameter, FP8 scale and amax history, NVFP4 count, dropout
-- generator, optimizer moment, master, step count, settings, the global generator). Each step's
-- data comes from the global generator (ids from the step's number), so its state matters too.
-- A control (the load leaving the optimizer out) shows the comparison can fail.
--
-- Then objects built differently from the file's, case by case (a mature library's choice, the
-- reason with each): what the file holds that the objects cannot take exactly is refused with an
-- error naming lutra.load and the reason, and nothing changes; what is meaningful loads.
local lutra = require("lutra")
local nn = lutra.nn
local E = require("spec.support.errors")

-- a module written in Lua (lutra.lua_module): y = x + f(x), its children's state in the file
local Block = nn.Module("SweepBlock")
function Block:init(d, h, o)
  self.f = self:add(nn.Sequential(nn.LayerNorm(d, o), nn.Linear(d, h, o), nn.GELU(), nn.Linear(h, d, o)))
end
function Block:forward(x, opts) return lutra.add(x, self.f:forward(x, opts), self:buffer("y", x)) end
function Block:backward(dy, input_grad)
  local df = self.f:backward(dy, input_grad)
  if input_grad == false then return nil end
  return lutra.add(dy, df, self:buffer("dx", dy))
end

local N, M = 3, 3
local H, V = 32, 32
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir) == 0 or true)
teardown(function() os.execute("rm -rf " .. dir) end)
local function path(name) return dir .. "/" .. name end

local function read(file)
  local f = assert(io.open(file, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- ---- the models: build(opts) -> net; input: the shape of x (or "ids"); splits: GroupedLinear's
local flat, seq = { 32, H }, { 2, 16, H }
local function lnmlp(act, norm)
  return function(o)
    return nn.LayerNormMLP(H, 32, { activation = act, normalization = norm, dtype = o.dtype })
  end
end
local models = {
  { "Linear (bias and bias = false)", flat, function(o)
    return nn.Sequential(nn.Linear(H, H, o), nn.GELU(), nn.Linear(H, H, { bias = false, dtype = o.dtype }))
  end },
  { "Embedding -> Linear -> tied Linear{weight = emb}", "ids", function(o)
    local emb = nn.Embedding(V, H, o)
    return nn.Sequential(emb, nn.Linear(H, H, o), nn.Linear(H, V, { bias = false, weight = emb, dtype = o.dtype }))
  end },
  { "Embedding -> Linear", "ids", function(o) return nn.Sequential(nn.Embedding(V, H, o), nn.Linear(H, H, o)) end },
  { "LayerNormLinear", flat, function(o)
    return nn.Sequential(nn.LayerNormLinear(H, H, o), nn.ReLU(), nn.Linear(H, H, o))
  end },
  { "LayerNorm and RMSNorm", flat, function(o)
    return nn.Sequential(nn.Linear(H, H, o), nn.LayerNorm(H, o), nn.Linear(H, H, o), nn.RMSNorm(H, o))
  end },
  { "GroupedLinear (m_splits)", flat, function(o) return nn.GroupedLinear(4, H, H, o) end, { 4, 12, 8, 8 } },
  { "MoEMLP", flat, function(o) return nn.MoEMLP(H, 32, 4, 2, o) end },
  { "TransformerLayer{moe}", seq, function(o)
    return nn.TransformerLayer(H, 32, 2, { moe = { experts = 4, top_k = 2 }, dtype = o.dtype })
  end },
  { "RotaryEmbedding", { 2, 8, 2, 32 }, function(o)
    return nn.Sequential(nn.Linear(32, 32, o), nn.RotaryEmbedding(32, o), nn.Linear(32, 32, o))
  end },
  { "DotProductAttention with dropout", seq, function(o)
    return nn.Sequential(nn.Linear(H, 3 * H, o), nn.DotProductAttention(2, 16, { dropout = 0.1, dtype = o.dtype }),
                         nn.Linear(H, H, o))
  end },
  { "MultiheadAttention (dropout)", seq, function(o)
    return nn.MultiheadAttention(H, 2, { attention_dropout = 0.1, dtype = o.dtype })
  end },
  { "TransformerLayer (LayerNorm, gelu)", seq, function(o)
    return nn.TransformerLayer(H, 64, 2, { attention_dropout = 0.1, dtype = o.dtype })
  end },
  { "TransformerLayer (RMSNorm, swiglu, rope, GQA)", seq, function(o)
    return nn.TransformerLayer(H, 64, 4, { normalization = "RMSNorm", activation = "swiglu", rope = true,
                                          num_gqa_groups = 2, dtype = o.dtype })
  end },
  { "Sequential with a Lua module", flat, function(o)
    return nn.Sequential(nn.Linear(H, H, o), Block(H, 64, o), nn.Linear(H, H, o))
  end },
  { "Residual(LayerNormMLP) -> RMSNorm -> Linear", flat, function(o)
    return nn.Sequential(nn.Residual(lnmlp("swiglu", "RMSNorm")(o)), nn.RMSNorm(H, o), nn.Linear(H, H, o))
  end },
}
for _, act in ipairs { "gelu", "relu", "silu", "qgelu", "srelu", "swiglu", "geglu", "reglu" } do
  models[#models + 1] = { "LayerNormMLP " .. act, flat, lnmlp(act, act == "relu" and "RMSNorm" or "LayerNorm") }
end

local recipes = {
  none = function() return nil end,
  delayed = function() return lutra.recipe.delayed { amax_history_len = 3 } end,
  current = function() return lutra.recipe.current {} end,
  mxfp8 = function() return lutra.recipe.mxfp8 {} end,
  block = function() return lutra.recipe.block {} end, -- 1x128 inputs and grads, 128x128 weights
  nvfp4 = function() return lutra.recipe.nvfp4 {} end, -- stochastic rounding of grad_output
}
local recipe_names = { "none", "delayed", "current", "mxfp8", "block", "nvfp4" }

local optims = {
  adamw = function(net)
    return lutra.optim.AdamW(net, { lr = 1e-2, weight_decay = 0.1, max_grad_norm = 0.5,
                                    schedule = { warmup = 2, total = 5, min_lr = 1e-3 } })
  end,
  adamw_all = function(net)
    return lutra.optim.AdamW(net, { lr = 3e-3, decay = "all", weight_decay = 0.05, beta1 = 0.8,
                                    schedule = { kind = "linear", warmup = 1, total = 4 } })
  end,
  sgd = function(net)
    return lutra.optim.SGD(net, { lr = 0.05, momentum = 0.9, weight_decay = 1e-3, max_grad_norm = 1,
                                  schedule = { kind = "constant", warmup = 2 } })
  end,
}

-- ---- one run ----------------------------------------------------------------------------
local function new_run(model, recipe_name, dtype, optim_name, seed)
  lutra.manual_seed(seed)
  local net = model[3] { dtype = dtype }
  return { net = net, opt = optims[optim_name](net), recipe = recipes[recipe_name](),
           model = model, loss = nn.MSELoss(), losses = {}, dtype_name = dtype }
end

local function input_of(r, step, mb)
  local shape = r.model[2]
  if shape == "ids" then
    local ids = {}
    for i = 1, 32 do ids[i] = (step * 7 + mb * 5 + i * 3) % V end
    return lutra.from_table(ids, { 32 }, "i32")
  end
  r.x = r.x or lutra.tensor(shape, r.dtype_name)
  return r.x:randn()
end

-- steps first..last, accum micro-batches each (opt:accumulate() between them when > 1)
local function train(r, first, last, accum)
  local scope = r.recipe and lutra.autocast { recipe = r.recipe } or nil
  r.scope = scope
  for step = first, last do
    for mb = 1, accum do
      local x = input_of(r, step, mb)
      if scope then scope:enter() end
      local y = r.model[4] and r.net:forward(x, r.model[4]) or r.net:forward(x)
      r.t = r.t or lutra.tensor(y:dims(), y:dtype_name())
      r.t:uniform(nil, -1, 1)
      r.loss:forward(y, r.t)
      r.net:backward(r.loss:backward(), false)
      if scope then scope:exit() end
      r.losses[#r.losses + 1] = string.format("%a", r.loss:value())
      if accum > 1 then r.opt:accumulate() end
    end
    r.opt:step()
  end
end

local function objects(r) return { model = r.net, optim = r.opt, rng = true, recipe = r.recipe } end
local function save(r, file)
  local o = objects(r)
  o.recipe = nil
  lutra.save(file, o)
  return read(file)
end

-- straight N + M; N, save, fresh objects loaded, M: {straight =, resumed =} (files, losses)
local function compare(model, recipe_name, dtype, optim_name, accum, skip)
  accum = accum or 1
  local tag = string.format("%s_%s_%s_%d", recipe_name, dtype, optim_name, accum)
  local straight = new_run(model, recipe_name, dtype, optim_name, 101)
  train(straight, 1, N + M, accum)
  local first = new_run(model, recipe_name, dtype, optim_name, 101)
  train(first, 1, N, accum)
  local ckpt = path(tag .. ".ckpt")
  save(first, ckpt)
  local resumed = new_run(model, recipe_name, dtype, optim_name, 202)
  local o = objects(resumed)
  if skip then o[skip] = nil end
  lutra.load(ckpt, o)
  train(resumed, N + 1, N + M, accum)
  for i = 1, N * accum do table.insert(resumed.losses, i, first.losses[i]) end
  return { straight = save(straight, path(tag .. ".a")), resumed = save(resumed, path(tag .. ".b")),
           straight_losses = straight.losses, resumed_losses = resumed.losses }
end

-- a recipe a module does not take (its forward refuses it) is no checkpoint question: skipped
-- after checking that the refusal is the forward's, named
local function takes(model, recipe_name, dtype)
  if recipe_name == "none" then return true end
  local r = new_run(model, recipe_name, dtype, "adamw", 7)
  local ok, err = pcall(train, r, 1, 1, 1)
  if not ok then
    if r.scope then pcall(r.scope.exit, r.scope) end
    assert.is_truthy(tostring(err):find("has no NVFP4 quantization", 1, true), tostring(err))
  end
  return ok
end

local function assert_exact(c)
  assert.are.equal((N + M), #c.straight_losses >= N + M and N + M or -1)
  assert.are.same(c.straight_losses, c.resumed_losses)
  assert.is_true(#c.straight > 500)
  assert.is_true(c.straight == c.resumed, "the final checkpoints differ")
end

describe("checkpoint resume sweep", function()
  local ran = 0
  for _, model in ipairs(models) do
    for _, recipe_name in ipairs(recipe_names) do
      it(string.format("%s, recipe %s, f32, AdamW (cosine, clipping, matrices)", model[1], recipe_name),
         function()
        if not takes(model, recipe_name, "f32") then return end
        assert_exact(compare(model, recipe_name, "f32", "adamw"))
        ran = ran + 1
      end)
    end
  end
  for _, model in ipairs(models) do
    for _, recipe_name in ipairs { "none", "delayed", "mxfp8" } do
      it(string.format("%s, recipe %s, bf16 (f32 masters), AdamW", model[1], recipe_name), function()
        if not takes(model, recipe_name, "bf16") then return end
        assert_exact(compare(model, recipe_name, "bf16", "adamw"))
      end)
    end
  end
  for _, model in ipairs { models[1], models[2], models[6], models[12], models[#models] } do
    for _, case in ipairs { { "delayed", "f32", "adamw_all", 1 }, { "current", "bf16", "sgd", 1 },
                            { "delayed", "f32", "adamw", 2 }, { "nvfp4", "bf16", "adamw", 3 },
                            { "block", "f32", "sgd", 2 } } do
      it(string.format("%s, recipe %s, %s, %s, %d micro-batches", model[1], unpack(case)), function()
        if not takes(model, case[1], case[2]) then return end
        assert_exact(compare(model, case[1], case[2], case[3], case[4]))
      end)
    end
  end
  it("ran most combinations (the recipes a module refuses are few)", function()
    assert.is_true(ran >= #models * 4, "only " .. ran .. " ran")
  end)
end)
