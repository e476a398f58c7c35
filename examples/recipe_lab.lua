-- The recipe lab: trains one model under each recipe of a list and compares them with f32.
--   luajit examples/recipe_lab.lua [--recipes examples/recipes/default.lua] [--steps 300]
--          [--depth 4] [--hidden 256] [--batch 128] [--lr 0.003] [--device cpu|cuda]
--          [--out lab_out] [--trace-every 1]
--          [--model mlp|gpt] [--layers 4] [--seq 64]
-- The model (--model mlp, the default) is examples/train_mlp.lua's (an MLP of `depth` Linears
-- with GELUs between, the last one named "head"; a fixed random teacher gives the normalized
-- regression targets); --model gpt is examples/gpt/model.lua's GPT (width --hidden, --layers
-- TransformerLayers, 4 heads, --seq tokens, --batch sequences) on Shakespeare's bytes (the
-- corpus of examples/train_gpt.lua), its first and last layers outside FP8 (and its LM head,
-- unless the recipe's entry says fp8_head = true), the final loss the validation loss. Each is
-- trained with AdamW from the same initial weights on the same batches under every recipe.
-- Written to --out:
--   loss.csv     step, then one column per recipe: the loss of every step
--   scales.csv   recipe, step, layer, role, scale, amax: every --trace-every steps, for the
--                quantizers with one scale (gpt: each FP8 layer's output projection; delayed
--                and current scaling; amax: the newest of a delayed history (0 for a history
--                of length 1, which the update clears), fp8_max / scale for current)
--   table.md     final loss and its ratio to the f32 run's, per recipe
--   loss.png     the loss curves (gnuplot; skipped, and said so, when gnuplot is not installed:
--                sh tools/bootstrap.sh lab installs it; LUTRA_LAB_GNUPLOT=none skips it too)
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local nn = lutra.nn

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("recipe_lab.lua")
  local p = argparse("recipe_lab.lua",
                     "Trains one model under each recipe of a list and compares them with f32.")
  p:option("--recipes", "a Lua file returning the list of recipes", "examples/recipes/default.lua")
  p:option("--steps", "training steps", "300", tonumber)
  p:option("--depth", "Linears in the MLP (at least 2)", "4", tonumber)
  p:option("--hidden", "hidden width", "256", tonumber)
  p:option("--batch", "rows per step", "128", tonumber)
  p:option("--lr", "AdamW learning rate", "0.003", tonumber)
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--out", "the folder the traces, table and plot go to", "lab_out")
  p:option("--trace-every", "trace the scales every N steps", "1", tonumber)
  p:option("--model", "the MLP of train_mlp.lua or the GPT of train_gpt.lua", "mlp")
   :choices({ "mlp", "gpt" })
  p:option("--layers", "gpt: TransformerLayers", "4", tonumber)
  p:option("--seq", "gpt: tokens per sequence", "64", tonumber)
  local o = p:parse(argv)
  if not (o.depth and o.depth >= 2) then p:error("--depth must be at least 2") end
  for _, k in ipairs({ "steps", "hidden", "batch", "lr", "trace_every" }) do
    if not o[k] then p:error("--" .. k:gsub("_", "-") .. " needs a number") end
  end
  return o
end

local opt = parse(arg)
local FEATURES, OUT = 64, 32
local entries = dofile(opt.recipes)
assert(type(entries) == "table" and #entries > 0, opt.recipes .. " must return a list of recipes")
local reference
for i, e in ipairs(entries) do
  assert(type(e.name) == "string", "entry " .. i .. " has no name")
  if e.recipe == nil and not reference then reference = i end
end
assert(reference, opt.recipes .. ": no entry without a recipe (the f32 reference)")

local function mlp(seed)
  local mods, linears = {}, {}
  for l = 1, opt.depth do
    local fin = l == 1 and FEATURES or opt.hidden
    local fout = l == opt.depth and OUT or opt.hidden
    local lin = nn.Linear(fin, fout, { seed = seed + l, device = opt.device,
                                       name = l == opt.depth and "head" or ("layer" .. l) })
    linears[l] = lin
    mods[#mods + 1] = lin
    if l < opt.depth then mods[#mods + 1] = nn.GELU() end
  end
  return nn.Sequential(unpack(mods)), linears
end

-- the task (as train_mlp.lua's): normalized outputs of a random teacher
local x = lutra.tensor({ opt.batch, FEATURES }, "f32", opt.device):randn(42)
local teacher = mlp(1000)
local values, sum, sq = teacher:forward(x):to_table(), 0, 0
for _, v in ipairs(values) do sum, sq = sum + v, sq + v * v end
local mean = sum / #values
local std = math.sqrt(math.max(sq / #values - mean * mean, 1e-12))
for i, v in ipairs(values) do values[i] = (v - mean) / std end
local target = lutra.from_table(values, { opt.batch, OUT }, "f32", opt.device)

local ROLES = { "input", "weight", "grad_output" }
local FP8_MAX = { input = 448, weight = 448, grad_output = 57344 }

local function trace_scales(rows, name, step, linears)
  for l, lin in ipairs(linears) do
    for _, role in ipairs(ROLES) do
      local q = lin:quantizer(role)
      local ok, scale = false, nil
      if q then ok, scale = pcall(q.scale, q) end -- per-block scales have no one scale
      if ok then
        local amax
        local okh, n = pcall(q.history_len, q)
        if okh then
          amax = q:history(n)[n] -- after the roll the newest amax is the last entry
        else
          amax = FP8_MAX[role] / scale -- current scaling (the default formats)
        end
        rows[#rows + 1] = string.format("%s,%d,%d,%s,%.9g,%.9g", name, step, l, role, scale, amax)
      end
    end
  end
end

-- a task: step() trains one step and returns its loss; final() the loss the table shows;
-- linears, the Linears whose scales are traced
local function mlp_task(recipe)
  local net, linears = mlp(1)
  local loss = nn.MSELoss()
  local optimizer = lutra.optim.AdamW(net, { lr = opt.lr, weight_decay = 0 })
  local scope = lutra.autocast { recipe = recipe }
  local task = { linears = linears }
  function task.step()
    scope:enter()
    local y = net:forward(x)
    scope:exit()
    loss:forward(y, target)
    net:backward(loss:backward(), false)
    optimizer:step()
    return loss:value()
  end
  return task
end

local gpt_data
local function gpt_task(recipe, entry)
  local corpus, model = require("corpus"), require("model")
  gpt_data = gpt_data or { corpus.split(corpus.byte_tokens(corpus.load()), 0.1) }
  local train, val = gpt_data[1], gpt_data[2]
  lutra.manual_seed(1)
  local gpt = model.new({ vocab = 256, dim = opt.hidden, layers = opt.layers, heads = 4,
                          seq = opt.seq, dtype = opt.device == "cuda" and "bf16" or "f32",
                          device = opt.device })
  if recipe then gpt:set_fp8(lutra.autocast { recipe = recipe }, nil, nil, entry.fp8_head) end
  local loss = nn.CrossEntropyLoss()
  local optimizer = lutra.optim.AdamW(gpt.all, { lr = opt.lr, weight_decay = 0.1 })
  local batches = corpus.batches(train, opt.batch, opt.seq, 1)
  local xs = lutra.tensor({ opt.batch, opt.seq }, "i32", opt.device)
  local ys = lutra.tensor({ opt.batch, opt.seq }, "i32", opt.device)
  local linears = {}
  for i = gpt.fp8_first or 1, gpt.fp8_last or 0 do
    linears[#linears + 1] = gpt.layers[i]:part("proj")
  end
  local task = { linears = linears }
  function task.step()
    batches:next(xs, ys)
    loss:forward(gpt:forward(xs, true), ys)
    gpt:backward(loss:backward())
    optimizer:step()
    return loss:value()
  end
  function task.final() -- the validation loss over (at most) 20 batches
    local sum, n = 0, 0
    for rows, vx, vy in corpus.batches(val, opt.batch, opt.seq):sequential(xs, ys) do
      if n >= 20 or rows < opt.batch then break end
      loss:forward(gpt:forward(vx, false), vy)
      sum, n = sum + loss:value(), n + 1
    end
    return sum / n
  end
  return task
end

local function run(entry)
  local recipe = entry.recipe and entry.recipe(lutra) or nil
  local task = (opt.model == "gpt" and gpt_task or mlp_task)(recipe, entry)
  local losses, scales = {}, {}
  local t0 = lutra.now()
  for step = 1, opt.steps do
    losses[step] = task.step()
    if recipe and (step - 1) % opt.trace_every == 0 then
      trace_scales(scales, entry.name, step, task.linears)
    end
  end
  local final = task.final and task.final() or losses[opt.steps]
  return { losses = losses, scales = scales, final = final, seconds = lutra.now() - t0 }
end

os.execute("mkdir -p '" .. opt.out .. "'")
local results = {}
for i, e in ipairs(entries) do
  io.write(string.format("%-24s", e.name))
  io.flush()
  results[i] = run(e)
  io.write(string.format(" final loss %.6g  (%.1f s)\n", results[i].final,
                         results[i].seconds))
end

-- loss.csv
local f = assert(io.open(opt.out .. "/loss.csv", "w"))
local header = { "step" }
for _, e in ipairs(entries) do header[#header + 1] = e.name end
f:write(table.concat(header, ","), "\n")
for step = 1, opt.steps do
  local row = { tostring(step) }
  for i = 1, #entries do row[#row + 1] = string.format("%.9g", results[i].losses[step]) end
  f:write(table.concat(row, ","), "\n")
end
f:close()

-- scales.csv
f = assert(io.open(opt.out .. "/scales.csv", "w"))
f:write("recipe,step,layer,role,scale,amax\n")
for i = 1, #entries do
  for _, row in ipairs(results[i].scales) do f:write(row, "\n") end
end
f:close()

-- table.md
local ref_final = results[reference].final
local shape = opt.model == "gpt"
              and string.format("GPT, %d layers, d %d, T %d", opt.layers, opt.hidden, opt.seq)
              or string.format("MLP, depth %d, hidden %d", opt.depth, opt.hidden)
local lines = {
  string.format("Recipe lab: %d steps, %s, batch %d, lr %g, %s; recipes from %s; final: %s",
                opt.steps, shape, opt.batch, opt.lr, opt.device, opt.recipes,
                opt.model == "gpt" and "validation loss" or "training loss of the last step"),
  "",
  "| recipe | final loss | ratio to " .. entries[reference].name .. " |",
  "|---|---:|---:|",
}
for i, e in ipairs(entries) do
  local final = results[i].final
  lines[#lines + 1] = string.format("| %s | %.6g | %.4f |", e.name, final, final / ref_final)
end
local tbl = table.concat(lines, "\n") .. "\n"
f = assert(io.open(opt.out .. "/table.md", "w"))
f:write(tbl)
f:close()
io.write("\n", tbl, "\n")

-- loss.png through gnuplot, when it is there
local function have_gnuplot()
  if os.getenv("LUTRA_LAB_GNUPLOT") == "none" then return false end
  return os.execute("command -v gnuplot > /dev/null 2>&1") == 0
end
if have_gnuplot() then
  local gp = { "set terminal png size 1000,600", "set output '" .. opt.out .. "/loss.png'",
               "set datafile separator ','", "set termoption noenhanced", "set logscale y",
               "set key outside right", "set xlabel 'step'",
               opt.model == "gpt" and "set ylabel 'cross-entropy'" or "set ylabel 'MSE loss'",
               "set title 'recipe lab: loss against " .. entries[reference].name .. "'" }
  local plots = {}
  for i, e in ipairs(entries) do
    plots[#plots + 1] = string.format("'%s/loss.csv' using 1:%d with lines lw %d title '%s'",
                                      opt.out, i + 1, i == reference and 3 or 1, e.name)
  end
  gp[#gp + 1] = "plot " .. table.concat(plots, ", ")
  local script = opt.out .. "/loss.gp"
  f = assert(io.open(script, "w"))
  f:write(table.concat(gp, "\n"), "\n")
  f:close()
  if os.execute("gnuplot '" .. script .. "'") == 0 then
    print("plot: " .. opt.out .. "/loss.png")
  else
    print("plot: gnuplot failed on " .. script)
  end
else
  print("plot skipped: gnuplot is not installed (sh tools/bootstrap.sh lab installs it); " ..
        "the CSV files are in " .. opt.out)
end
