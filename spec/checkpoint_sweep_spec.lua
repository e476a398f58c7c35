-- Exact resume, swept (CPU backend): for every module kind x every recipe the CPU runs x the
-- optimizer settings, N steps, save {model, optim, rng}, load into objects built afresh (the
-- same way, after another manual_seed: other weights, other dropout seeds), M more steps must
-- equal N + M steps straight bit for bit: every step's loss, and the final checkpoint files of
-- both runs byte for byte (every parameter, FP8 scale and amax history, NVFP4 count, dropout
-- generator, optimizer moment, master, step count, settings, the global generator). Each step's
-- data comes from the global generator (ids from the step's number), so its state matters too.
-- Controls (the load leaving out the optimizer, the generator or the FP8 state) show the
-- comparison can fail. Under delayed scaling a save inside an accumulation window is refused for
-- every module kind.
--
-- Then objects built differently from the file's, case by case (a mature library's choice, the
-- reason with each): what the file holds that the objects cannot take exactly is refused with an
-- error naming lutra_checkpoint_load and the reason, and nothing changes; what is meaningful
-- loads.
local lutra = require("lutra")
local nn = lutra.nn
local E = require("spec.support.errors")
local st = require("spec.support.st_edit")

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
local dir = st.tempdir(true) -- in memory where there is /dev/shm: hundreds of saves
teardown(function() os.execute("rm -rf " .. dir) end)
local function path(name) return dir .. "/" .. name end
local read = st.read

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
  -- main grads: zeroed at each step's start (train), so a step boundary holds none to save
  { "Linear and LayerNormLinear with accumulate_main_grad", flat, function(o)
    return nn.Sequential(nn.Linear(H, H, { accumulate_main_grad = true, dtype = o.dtype }), nn.GELU(),
                         nn.LayerNormLinear(H, H, { accumulate_main_grad = true, dtype = o.dtype }))
  end },
  { "Residual(LayerNormMLP) -> RMSNorm -> Linear", flat, function(o)
    return nn.Sequential(nn.Residual(lnmlp("swiglu", "RMSNorm")(o)), nn.RMSNorm(H, o), nn.Linear(H, H, o))
  end },
}
for _, act in ipairs { "gelu", "relu", "silu", "qgelu", "srelu", "tanh", "swiglu", "geglu", "reglu" } do
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
  -- built differently from "adamw": another lr, schedule and clipping (which have setters, and
  -- which the file brings)
  adamw_other_lr = function(net)
    return lutra.optim.AdamW(net, { lr = 1, weight_decay = 0.1, max_grad_norm = 0,
                                    schedule = { kind = "linear", warmup = 0, total = 100 } })
  end,
}
-- built like "adamw" but for one fixed hyper-parameter (no setter: the file's must be the same)
local function adamw_but(key, value)
  return function(net)
    local o = { lr = 1e-2, weight_decay = 0.1, max_grad_norm = 0.5,
                schedule = { warmup = 2, total = 5, min_lr = 1e-3 } }
    o[key] = value
    return lutra.optim.AdamW(net, o)
  end
end

-- ---- one run ----------------------------------------------------------------------------
local function new_run(model, recipe_name, dtype, optim_name, seed)
  lutra.manual_seed(seed)
  local net = model[3] { dtype = dtype }
  local recipe = type(recipe_name) == "function" and recipe_name() or recipes[recipe_name]()
  local make_optim = type(optim_name) == "function" and optim_name or optims[optim_name]
  return { net = net, opt = make_optim(net), recipe = recipe,
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
    r.net:zero_grad()
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
-- resumed_optim: the resumed run's optimizer when built differently; prepare(resumed): before the load
local function compare(model, recipe_name, dtype, optim_name, accum, skip, resumed_optim, prepare)
  accum = accum or 1
  local tag = string.format("%s_%s_%s_%d", recipe_name, dtype, optim_name, accum)
  local straight = new_run(model, recipe_name, dtype, optim_name, 101)
  train(straight, 1, N + M, accum)
  local first = new_run(model, recipe_name, dtype, optim_name, 101)
  train(first, 1, N, accum)
  local ckpt = path(tag .. ".ckpt")
  save(first, ckpt)
  local resumed = new_run(model, recipe_name, dtype, resumed_optim or optim_name, 202)
  if prepare then prepare(resumed) end
  local o = objects(resumed)
  if skip then o[skip] = nil end
  if resumed.skip_fp8 then o.fp8 = false end
  lutra.load(ckpt, o)
  train(resumed, N + 1, N + M, accum)
  for i = 1, N * accum do table.insert(resumed.losses, i, first.losses[i]) end
  return { straight = save(straight, path(tag .. ".a")), resumed = save(resumed, path(tag .. ".b")),
           straight_losses = straight.losses, resumed_losses = resumed.losses, accum = accum }
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
  assert.are.equal((N + M) * c.accum, #c.straight_losses)
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
    for _, recipe_name in ipairs(recipe_names) do
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
  -- delayed scaling: the FP8 weight a forward with is_first_microbatch true cached is not in the
  -- file, so a save before the optimizer step is refused for every module kind that caches one
  -- (a kind that caches none saves: there is nothing left out)
  for _, model in ipairs(models) do
    it(model[1] .. ": a save inside a delayed-scaling accumulation window is refused", function()
      local r = new_run(model, "delayed", "f32", "adamw", 9)
      local scope = lutra.autocast { recipe = r.recipe }
      local x = input_of(r, 1, 1)
      scope:enter()
      local y = model[4] and r.net:forward(x, model[4], { is_first_microbatch = true })
                or r.net:forward(x, { is_first_microbatch = true })
      scope:exit()
      local t = lutra.tensor(y:dims()):randn()
      r.loss:forward(y, t)
      r.net:backward(r.loss:backward(), false)
      local ok, err = pcall(lutra.save, path("window"), { model = r.net })
      assert.is_false(ok, model[1] .. ": saved inside the window")
      assert.is_truthy(tostring(err):find("gradient-accumulation window", 1, true), tostring(err))
      r.opt:step()
      lutra.save(path("window"), { model = r.net })
    end)
  end
  -- controls: the oracle catches a resume that misses state (the load leaving a part out)
  for _, case in ipairs { { models[1], "optim", "none" }, { models[10], "rng", "none" },
                          { models[16], "fp8", "delayed" } } do
    it(case[1][1] .. ": differs when the load leaves out " .. case[2] .. " (control)", function()
      local r
      if case[2] == "fp8" then
        r = compare(case[1], case[3], "f32", "adamw", 1, nil, nil, function(run) run.skip_fp8 = true end)
      else
        r = compare(case[1], case[3], "f32", "adamw", 1, case[2])
      end
      assert.is_false(r.straight == r.resumed)
    end)
  end
  it("ran most combinations (the recipes a module refuses are few)", function()
    assert.is_true(ran >= #models * 4, "only " .. ran .. " ran")
  end)
end)

-- ---- objects built differently from the file's --------------------------------------------
-- a file of model (recipe, dtype, optimizer as named) after N steps
local function file_of(model, recipe_name, dtype, optim_name, name)
  local r = new_run(model, recipe_name, dtype, optim_name, 101)
  train(r, 1, N, 1)
  local file = path(name)
  save(r, file)
  return file
end

-- the load of file into r's objects (plus extra) is refused naming lutra_checkpoint_load and
-- reason, and changes nothing (r's whole state saved before and after is the same)
local function refused(file, r, reason, opts)
  local before = save(r, path("before"))
  E.expect_error(function() lutra.load(file, objects(r), opts) end, "lutra_checkpoint_load", reason)
  assert.is_true(before == save(r, path("after")), "a refused load changed the objects")
end

local linear = models[1]
local function two_linears(width)
  return { "two Linears", flat, function(o)
    return nn.Sequential(nn.Linear(H, width, o), nn.GELU(), nn.Linear(width, H, o))
  end }
end

describe("checkpoint load into objects built differently", function()
  -- FP8 state is per recipe: scales of another scaling rule would mean another thing
  it("another recipe: refused (the file's FP8 state has no place, or lacks the model's)", function()
    local file = file_of(linear, "delayed", "f32", "adamw", "delayed.ckpt")
    refused(file, new_run(linear, "current", "f32", "adamw", 5), "amax_history")
    local cur = file_of(linear, "current", "f32", "adamw", "current.ckpt")
    refused(cur, new_run(linear, "delayed", "f32", "adamw", 5), "lacks tensor")
  end)

  it("another amax_history_len: refused (the history's shape)", function()
    local file = file_of(linear, "delayed", "f32", "adamw", "h3.ckpt")
    local r = new_run(linear, function() return lutra.recipe.delayed { amax_history_len = 5 } end,
                      "f32", "adamw", 5)
    refused(file, r, "has shape [3]")
  end)

  -- a delayed recipe with another margin or amax_compute_algo: the file's state (scales,
  -- histories) is restored exactly and the recipe is the caller's choice for the steps to come,
  -- as a TransformerEngine module loads its extra state under whatever recipe the next autocast
  -- names: the resumed steps equal a straight run that switched recipes at step N
  it("another delayed recipe of the same history length: loads, the state exact", function()
    local file = file_of(linear, "delayed", "f32", "adamw", "margin.ckpt")
    local r = new_run(linear, function() return lutra.recipe.delayed { amax_history_len = 3, margin = 1 } end,
                      "f32", "adamw", 5)
    lutra.load(file, objects(r))
    local back = path("margin.back")
    save(r, back)
    assert.is_true(read(file) == read(back), "the loaded state differs from the file's")
  end)

  it("other shapes, a missing module, an extra module: refused naming the tensor", function()
    local file = file_of(linear, "none", "f32", "adamw", "shapes.ckpt")
    refused(file, new_run(two_linears(64), "none", "f32", "adamw", 5), "has shape")
    local one = { "one Linear", flat, function(o) return nn.Sequential(nn.Linear(H, H, o)) end }
    refused(file, new_run(one, "none", "f32", "adamw", 5), "which the objects do not have")
    local three = { "three Linears", flat, function(o)
      return nn.Sequential(nn.Linear(H, H, o), nn.GELU(), nn.Linear(H, H, o), nn.Linear(H, H, o))
    end }
    refused(file, new_run(three, "none", "f32", "adamw", 5), "lacks tensor")
  end)

  -- bf16 parameters and their f32 masters: an f32 model has no masters to take them
  it("another dtype: refused (convert = true converts the parameters of a model alone)", function()
    local file = file_of(linear, "none", "bf16", "adamw", "bf16.ckpt")
    local r = new_run(linear, "none", "f32", "adamw", 5)
    refused(file, r, "convert = true converts")
    refused(file, r, ".master', which the objects do not have", { convert = true })
    lutra.load(file, { model = r.net }, { convert = true })
  end)

  -- names and shapes are the contract (torch's load_state_dict): a module of another kind under
  -- the same names whose parameters differ in shape or number is refused; one whose parameters
  -- are the same (LayerNormMLP gelu and relu: the same norm, fc1, fc2) takes them, their meaning
  -- the same
  it("another module kind under the same names: refused where the parameters differ", function()
    local ln = { "LayerNorm", flat, function(o) return nn.Sequential(nn.Linear(H, H, o), nn.LayerNorm(H, o)) end }
    local rms = { "RMSNorm", flat, function(o) return nn.Sequential(nn.Linear(H, H, o), nn.RMSNorm(H, o)) end }
    local file = file_of(ln, "none", "f32", "adamw", "ln.ckpt")
    refused(file, new_run(rms, "none", "f32", "adamw", 5), "1.bias")
    local gelu = file_of(models[#models - 8], "none", "f32", "adamw", "gelu.ckpt")
    refused(gelu, new_run(models[#models - 2], "none", "f32", "adamw", 5), "has shape") -- swiglu
    local r = new_run(models[#models - 6], "none", "f32", "adamw", 5) -- silu
    lutra.load(gelu, objects(r))
  end)

  it("an SGD file into AdamW: refused", function()
    local file = file_of(linear, "none", "f32", "sgd", "sgd.ckpt")
    refused(file, new_run(linear, "none", "f32", "adamw", 5), "holds sgd optimizer state")
  end)

  -- lr, schedule and max_grad_norm have setters (optim:set_lr, ...): the file's are restored, and
  -- the caller changes them after the load if it wants others
  it("another lr, schedule and clipping: the file's restored, the resume exact", function()
    assert_exact(compare(linear, "delayed", "f32", "adamw", 1, nil, "adamw_other_lr"))
  end)

  -- weight_decay, the decay rule, betas, eps and momentum are fixed when the optimizer is built
  -- (no setter): taking the file's would silently override the caller's construction, keeping
  -- the optimizer's would silently resume another run; refused (they were not saved before: the
  -- old code resumed with the new optimizer's, silently)
  for _, case in ipairs { { "weight_decay", 0 }, { "beta1", 0.8 }, { "beta2", 0.99 }, { "eps", 1e-6 },
                          { "decay", "all" } } do
    it("another " .. case[1] .. ": refused naming it", function()
      local file = file_of(linear, "none", "f32", "adamw", "fixed.ckpt")
      refused(file, new_run(linear, "none", "f32", adamw_but(case[1], case[2]), 5), case[1])
    end)
  end
  it("another SGD momentum: refused naming it", function()
    local file = file_of(linear, "none", "f32", "sgd", "momentum.ckpt")
    local r = new_run(linear, "none", "f32", function(net)
      return lutra.optim.SGD(net, { lr = 0.05, momentum = 0.5, weight_decay = 1e-3, max_grad_norm = 1,
                                    schedule = { kind = "constant", warmup = 2 } })
    end, 5)
    refused(file, r, "momentum 0.899999976, the optimizer given has 0.5")
  end)
  it("a file written before the fixed hyper-parameters were saved: loads", function()
    local file = file_of(linear, "none", "f32", "adamw", "old.ckpt")
    local header, data = st.split(read(file))
    local n
    header, n = header:gsub('"optim%.[a-z_0-9]+":"[^"]*",?', function(kv)
      for _, k in ipairs { "weight_decay", "beta1", "beta2", "eps", "decay" } do
        if kv:find('"optim.' .. k .. '"', 1, true) then return "" end
      end
    end)
    assert.is_true(n >= 5)
    header = header:gsub(",}", "}")
    st.write(file, st.join(header, data))
    lutra.load(file, objects(new_run(linear, "none", "f32", adamw_but("weight_decay", 0), 5)))
  end)

  it("a file with some of the fixed hyper-parameters, or a bad one: refused as damaged", function()
    local file = file_of(linear, "none", "f32", "adamw", "damaged.ckpt")
    local header, data = st.split(read(file))
    local r = new_run(linear, "none", "f32", "adamw", 5)
    st.write(file, st.join((header:gsub('"optim%.beta1":"[^"]*",?', "")), data))
    refused(file, r, "some of the optimizer's hyper-parameters, not all")
    st.write(file, st.join(st.set_meta(header, "optim.decay", "none"), data))
    refused(file, r, "optim.decay 'none' is not all or matrices")
    st.write(file, st.join(st.set_meta(header, "optim.eps", "-1"), data))
    refused(file, r, "optim.eps '-1' must be >= 0")
  end)

  -- the file's state is a step's end (a save inside a window is refused): a window the loading
  -- optimizer had open is closed, its sums belonging to no step of the file's run (the old code
  -- averaged them into the first resumed step, silently)
  it("an optimizer inside an accumulation window: the window closed, the resume exact", function()
    assert_exact(compare(linear, "current", "f32", "adamw", 2, nil, nil, function(r)
      train(r, 1, 1, 1) -- a micro-batch summed, not stepped
      r.opt:step()
      local x = lutra.tensor(flat):randn()
      r.loss:forward(r.net:forward(x), lutra.tensor(flat):randn())
      r.net:backward(r.loss:backward(), false)
      r.opt:accumulate()
      assert.are.equal(1, r.opt:accumulated())
      r.losses = {}
    end))
  end)
end)
