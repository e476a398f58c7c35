#!/usr/bin/env luajit
-- A GPT training step on the GPU, the model of examples/train_gpt.lua (examples/gpt/model.lua:
-- token + learned position embedding, pre-norm TransformerLayers, final LayerNorm, LM head tied
-- to the token embedding, cross-entropy), AdamW (clipped, scheduled), uniform random tokens (throughput does not
-- depend on them). bench/gpt_torch.py is the PyTorch side: the same configs, run it in the same
-- call.
-- Each config is timed two ways: "eager" (each module call issued from Lua) and "graph" (the
-- whole step, optimizer included, captured once with lutra.graph.capture and replayed).
-- Prints one markdown row per (config, build, recipe): ms/step (median of --reps batches of
-- --steps steps between synchronizations, after --warmup steps), tokens/s, MFU against the
-- dense BF16 peak (989 TFLOP/s on H100 and H200; FLOPs per token 6 N + 12 L T d, N the
-- parameters less the position embedding: PaLM's count, as gpt_torch.py), peak device memory
-- (the stream-ordered pool's high-water mark, lutra.device_memory), the host time to issue one
-- step (median of 5, no synchronization), the loss after the timed steps and, for a graph, its
-- nodes (the kernels, memsets and copies a step launches).
-- Usage (on the GPU machine, from the repository root):
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/gpt_bench.lua [--configs small,gpt2]
--     [--recipes none,delayed] [--builds eager,graph] [--warmup 5] [--steps 10] [--reps 5]
--     [--out FILE.md] [--device cuda|cpu] [--breakdown small|gpt2]
-- --breakdown CONFIG: instead, the GPU time of each piece of an eager step (embeddings, layers,
-- head, loss, AdamW), a synchronization around each: where a step's milliseconds go; one table
-- per entry of --recipes.
-- --recipes takes lutra.recipe names as the example runs them (the first and last layer and the
-- LM head in BF16), NAME+head (the LM head in FP8 too) and NAME+all (every layer and the head).
-- --device cpu: a tiny config in f32, a smoke test of the script.
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local model = require("model")
local timing = require("bench.support.timing")

local CONFIGS = {
  small = { vocab = 8192, dim = 256, layers = 4, heads = 4, seq = 256, batch = 32 },
  gpt2 = { vocab = 50304, dim = 768, layers = 12, heads = 12, seq = 1024, batch = 16 },
  tiny = { vocab = 256, dim = 64, layers = 2, heads = 2, seq = 32, batch = 4 },
}
local PEAK_TFLOPS = 989
-- gpt_torch.py's optimizer: AdamW, decay on matrices only (lutra's default), global-norm
-- clipping at 1, warmup + cosine; the schedule and the clipping run inside the step
local ADAMW = { lr = 6e-4, weight_decay = 0.1, beta2 = 0.95, max_grad_norm = 1.0,
                schedule = { warmup = 100, total = 10000, min_lr = 6e-5 } }

local function parse(argv)
  local argparse = require("lutra.cli").argparse("gpt_bench.lua")
  local p = argparse("gpt_bench.lua", "A GPT training step: tokens/s, MFU, memory, host time.")
  p:option("--configs", "comma-separated: small, gpt2, tiny", "small,gpt2")
  p:option("--recipes", "comma-separated: none and lutra.recipe names (delayed, current, ...); "
           .. "NAME+head: the LM head in FP8 too, NAME+all: every layer and the head",
           "none,delayed")
  p:option("--builds", "comma-separated: eager, graph", "eager,graph")
  p:option("--warmup", "steps before timing", "5", tonumber)
  p:option("--steps", "steps per timed batch", "10", tonumber)
  p:option("--reps", "timed batches", "5", tonumber)
  p:option("--out", "also write the table to this markdown file")
  p:option("--breakdown", "instead: where one eager step of this config spends its GPU time")
  p:option("--device", "cuda, or cpu (the tiny config in f32: a smoke test)", "cuda")
   :choices({ "cuda", "cpu" })
  return p:parse(argv)
end

local o = parse(arg)
local DEV = o.device
require("lutra.cli").need_device("gpt_bench.lua", DEV)
local DTYPE = DEV == "cuda" and "bf16" or "f32"

local function split(s)
  local t = {}
  for w in s:gmatch("[^,]+") do t[#t + 1] = w end
  return t
end

-- inputs and targets of one batch, uniform random ids
local function random_tokens(c)
  local x = lutra.tensor({ c.batch, c.seq }, "i32", DEV)
  local y = lutra.tensor({ c.batch, c.seq }, "i32", DEV)
  local ids = {}
  for i = 1, c.batch * c.seq do ids[i] = math.random(0, c.vocab - 1) end
  x:set(ids)
  for i = 1, c.batch * c.seq do ids[i] = math.random(0, c.vocab - 1) end
  y:set(ids)
  return x, y
end

-- FP8 for the model as a --recipes entry asks: NAME (the middle layers, the model's default),
-- NAME+head (and the LM head), NAME+all (every layer and the head)
local function set_recipe(gpt, recipe)
  if recipe == "none" then return end
  local named, extent = recipe:match("^([^+]+)%+(%a+)$")
  if not named then named, extent = recipe, "" end
  if named:find("+", 1, true) or not (extent == "" or extent == "head" or extent == "all") then
    error("gpt_bench.lua: recipe " .. recipe .. " is not NAME, NAME+head or NAME+all", 0)
  end
  local scope = lutra.autocast { recipe = lutra.recipe.named(named) }
  local all = extent == "all"
  gpt:set_fp8(scope, all and 1 or nil, all and #gpt.layers or nil, extent ~= "")
end

-- the previous run's model, optimizer and graph freed first: each row's peak memory its own.
-- A full collection runs the finalizers of what is unreachable, and what those objects hold
-- goes in a later one: collect until the device memory lutra holds stops falling (two fixed
-- collections left a whole model held in one process of four).
local function release_previous()
  local held = math.huge
  for _ = 1, 16 do
    collectgarbage()
    local now = lutra.device_memory(DEV) or 0
    if now >= held then break end
    held = now
  end
end

local function run(name, c, build, recipe)
  release_previous()
  lutra.manual_seed(0)
  local gpt = model.new({ vocab = c.vocab, dim = c.dim, layers = c.layers, heads = c.heads,
                          seq = c.seq, dtype = DTYPE, device = DEV })
  set_recipe(gpt, recipe)
  local loss = lutra.nn.CrossEntropyLoss()
  local opt = lutra.optim.AdamW(gpt.all, ADAMW)
  local x, y = random_tokens(c)
  local function step()
    loss:forward(gpt:forward(x, true), y)
    gpt:backward(loss:backward())
    opt:step()
  end
  local issue, nodes, g = step, "-", nil
  if build == "graph" then
    g = lutra.graph.capture(step, { warmup = 2 })
    issue = function() g:replay() end
    nodes = tostring((g:info()))
  end
  for _ = 1, o.warmup do issue() end
  lutra.synchronize(DEV)
  lutra.device_memory(DEV, true) -- the peak from here on
  local ms = timing.time_per_call(DEV, issue, o.steps, o.reps) * 1e3
  local host = {}
  for i = 1, 5 do
    lutra.synchronize(DEV)
    local t0 = lutra.now()
    issue()
    host[i] = (lutra.now() - t0) * 1e3
  end
  lutra.synchronize(DEV)
  local _, peak = lutra.device_memory(DEV)
  local tokens = c.batch * c.seq / ms * 1e3
  local mfu = gpt:flops_per_token() * tokens / (PEAK_TFLOPS * 1e12) * 100
  local row = string.format("| %s | lutra %s%s | %.2f | %.0f | %.1f%% | %s | %.3f | %.3f | %s |",
                            name, build, recipe == "none" and "" or " " .. recipe, ms, tokens, mfu,
                            peak and string.format("%.2f", peak / 2 ^ 30) or "-",
                            timing.median(host), loss:value(), nodes)
  print(row)
  io.stdout:flush()
  if g then g:destroy() end -- its memory back now, not at a later collection
  return row
end

local function gib(bytes) return bytes and string.format("%.2f", bytes / 2 ^ 30) or "-" end

-- GPU time of each piece of an eager step (a synchronization around each; median of 5 steps)
-- and the launches it issues (the nodes of a CUDA graph captured from it: kernels, memsets,
-- copies; cuda only)
local function breakdown(name, recipe)
  local c = CONFIGS[name] or error("gpt_bench.lua: unknown config " .. name)
  release_previous()
  lutra.manual_seed(0)
  local gpt = model.new({ vocab = c.vocab, dim = c.dim, layers = c.layers, heads = c.heads,
                          seq = c.seq, dtype = DTYPE, device = DEV })
  set_recipe(gpt, recipe)
  local loss = lutra.nn.CrossEntropyLoss()
  local opt = lutra.optim.AdamW(gpt.all, ADAMW)
  local x, y = random_tokens(c)
  local opts = { grad = true }
  local h, d -- the activation and the gradient passed from piece to piece
  local pieces = {
    { "embeddings forward", function()
      h = gpt.tok:forward(x, opts):add_(gpt.pos:forward(gpt:positions(c.batch, c.seq), opts))
    end },
    { "layers forward", function() h = gpt:layers_forward(h, opts) end },
    { "final norm + head forward", function() h = gpt:head_forward(h, opts) end },
    { "loss forward + backward", function()
      loss:forward(h, y)
      d = loss:backward()
    end },
    { "head + final norm backward", function() d = gpt.norm:backward(gpt.head:backward(d)) end },
    { "layers backward", function()
      for i = #gpt.layers, 1, -1 do d = gpt.layers[i]:backward(d) end
    end },
    { "embeddings backward", function()
      gpt.tok:backward(d, false)
      gpt.pos:backward(d, false)
    end },
    { "AdamW step", function() opt:step() end },
  }
  local times, held, peaks = {}, {}, {}
  for rep = 1, 7 do
    for k, piece in ipairs(pieces) do
      lutra.synchronize(DEV)
      lutra.device_memory(DEV, true)
      local t0 = lutra.now()
      piece[2]()
      lutra.synchronize(DEV)
      times[k] = times[k] or {}
      if rep > 2 then table.insert(times[k], (lutra.now() - t0) * 1e3) end -- 2 warm-up steps
      held[k], peaks[k] = lutra.device_memory(DEV)
    end
  end
  print(string.format("# %s%s: each piece of an eager step, GPU ms (median of 5), launches, "
                      .. "device memory lutra holds after it and at most during it (GiB, last "
                      .. "step)", name, recipe == "none" and "" or " " .. recipe))
  print("| piece | ms | launches | GiB after | GiB peak |")
  print("|---|---:|---:|---:|---:|")
  local total_ms, total_nodes = 0, 0
  for k, piece in ipairs(pieces) do
    local nodes = "-"
    if DEV == "cuda" then
      local g = lutra.graph.capture(piece[2], { warmup = 0 })
      nodes = g:info()
      total_nodes = total_nodes + nodes
      g:destroy()
    end
    local ms = (timing.median(times[k]))
    total_ms = total_ms + ms
    print(string.format("| %s | %.3f | %s | %s | %s |", piece[1], ms, tostring(nodes),
                        gib(held[k]), gib(peaks[k])))
  end
  print(string.format("| total | %.3f | %d | | |", total_ms, total_nodes))
end
if o.breakdown then
  for _, recipe in ipairs(split(o.recipes)) do breakdown(o.breakdown, recipe) end
  return
end

local HEAD = "| config | build | ms/step | tokens/s | MFU | peak GiB | host ms/step | loss | "
             .. "launches |"
local ALIGN = "|---|---|---:|---:|---:|---:|---:|---|---:|"
local rows = {}
local title = string.format("# lutra %s GPT step, %s on %s", lutra.version(), DTYPE, DEV)
print(title)
print(HEAD)
print(ALIGN)
for _, name in ipairs(DEV == "cpu" and { "tiny" } or split(o.configs)) do
  local c = CONFIGS[name] or error("gpt_bench.lua: unknown config " .. name)
  for _, recipe in ipairs(DEV == "cpu" and { "none" } or split(o.recipes)) do
    for _, build in ipairs(DEV == "cpu" and { "eager" } or split(o.builds)) do
      local ok, row = pcall(run, name, c, build, recipe)
      if not ok then
        row = string.format("| %s | lutra %s %s | failed: %s |", name, build, recipe,
                            tostring(row):sub(1, 200))
        print(row)
      end
      rows[#rows + 1] = row
    end
  end
end
if o.out then
  local f = assert(io.open(o.out, "w"))
  f:write(table.concat({ title, "", HEAD, ALIGN, table.concat(rows, "\n") }, "\n"), "\n")
  f:close()
end
