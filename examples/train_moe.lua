-- Trains a top-2 mixture-of-experts feed-forward layer on a task where experts must
-- specialise: inputs come from several clusters, each with its own target function.
--   luajit examples/train_moe.lua [--experts grouped|linear] [--recipe none|delayed|current|
--          mxfp8|block] [--graph off|on] [--device cpu|cuda] [--steps 400] [--batch 256]
--          [--num-experts 8] [--clusters 8] [--k 2] [--hidden 64] [--lr 0.01] [--every 100]
--          [--dtype auto|f32|bf16]
-- (--help lists them with their defaults)
-- The layer: router (a Linear + the fused softmax-top-k, lutra.moe.Router) -> permute
-- (lutra.moe.Dispatcher: expert-contiguous rows and the device m_splits) -> expert MLP
-- (nn.GroupedLinear -> GELU -> nn.GroupedLinear, one grouped GEMM each, reading the splits on
-- the device) -> unpermute (combine with the router's probabilities). The router is trained
-- through the unpermute's gradient of the probabilities. FP8 (--recipe) covers the experts;
-- the router stays in high precision, as TransformerEngine/Megatron keep it.
--
-- --experts grouped (the default) runs the experts as nn.GroupedLinear (in bf16 on cuda, where
-- its grouped GEMM has no f32 kernels: --dtype auto). --experts linear is a documented REFERENCE mode: each
-- expert is an nn.Linear run over its slice of the permuted rows, with the splits read back by
-- the host (a synchronization per layer and call, new buffers when the splits change, so no
-- CUDA graph): slow, but the rest of the layer is the same code and can be checked anywhere.
-- --graph on (cuda, grouped experts): step 1 runs eagerly, the step is then captured once and
-- every later step is a replay with a new batch, hence new routing and new device splits.
-- At the end it prints the loss ratio and how pure each cluster's top-1 routing is, and exits 1
-- if the loss did not fall below 0.2 x the first or the routing did not specialise.
local lutra = require("lutra")
local ffi = require("ffi")
local nn, moe = lutra.nn, lutra.moe

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("train_moe.lua")
  local p = argparse("train_moe.lua", "Trains a top-2 mixture-of-experts feed-forward layer on "
                     .. "clustered inputs whose experts must specialise.")
  p:option("--experts", "grouped: nn.GroupedLinear; linear: the nn.Linear reference mode",
           "grouped"):choices({ "grouped", "linear" })
  p:option("--recipe", "FP8 recipe of the experts", "none")
   :choices({ "none", "delayed", "current", "mxfp8", "block" })
  p:option("--graph", "on (cuda, grouped): capture the step once and replay it", "off")
   :choices({ "off", "on" })
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--steps", "training steps", "400", tonumber)
  p:option("--batch", "tokens per step", "256", tonumber)
  p:option("--num-experts", "experts", "8", tonumber):target("num-experts")
  p:option("--clusters", "input clusters", "8", tonumber)
  p:option("--k", "experts per token", "2", tonumber)
  p:option("--hidden", "expert hidden width", "64", tonumber)
  p:option("--lr", "AdamW learning rate", "0.01", tonumber)
  p:option("--every", "print the loss every N steps", "100", tonumber)
  p:option("--dtype", "the layer's dtype; auto: bf16 on cuda with grouped experts, else f32",
           "auto"):choices({ "auto", "f32", "bf16" })
  return p:parse(argv)
end

local opt = parse(arg)
local D, E, K, C, B, F = 32, opt["num-experts"], opt.k, opt.clusters, opt.batch, opt.hidden
local dev = opt.device
-- the layer's dtype: GroupedLinear's grouped GEMM on cuda runs in bf16 (it has no f32 kernels),
-- so "auto" is bf16 there and f32 elsewhere (the linear reference mode copies f32 rows)
local DT = opt.dtype
if DT == "auto" then DT = (dev == "cuda" and opt.experts == "grouped") and "bf16" or "f32" end
assert(DT == "f32" or opt.experts == "grouped", "--experts linear runs in f32")
if opt.graph == "on" and (dev ~= "cuda" or opt.experts ~= "grouped") then
  io.stderr:write("--graph on needs --device cuda and --experts grouped (the linear reference ",
                  "mode reads the splits on the host)\n")
  os.exit(2)
end

-- ---- the task ------------------------------------------------------------------------------
-- cluster c: centre m_c (norm ~3), x = m_c + 0.5 noise, target tanh(A_c (x - m_c)) + b_c with
-- its own A_c, b_c: one expert per cluster can fit it, one shared MLP of the same size hardly
local rng = lutra.tensor({ 2 * C * D * D + 2 * C * D }):randn(7):to_table()
local function param(i) return rng[i] end
local centres, maps, offsets = {}, {}, {}
do
  local at = 1
  for c = 1, C do
    centres[c], offsets[c], maps[c] = {}, {}, {}
    for d = 1, D do centres[c][d] = 3 * param(at) / math.sqrt(D) * 2; at = at + 1 end
    for d = 1, D do offsets[c][d] = 0.5 * param(at); at = at + 1 end
    for r = 1, D * D do maps[c][r] = 1.5 * param(at) / math.sqrt(D); at = at + 1 end
  end
end

-- a pool of batches made once on the host (x, target, cluster of each row)
local POOL = 8
local pool = {}
for p = 1, POOL do
  local noise = lutra.tensor({ B * D }):randn(100 + p):to_table()
  local pick = lutra.tensor({ B }):uniform(200 + p, 0, C):to_table()
  local xb, yb, cl = ffi.new("float[?]", B * D), ffi.new("float[?]", B * D), {}
  for r = 0, B - 1 do
    local c = math.min(C, math.floor(pick[r + 1]) + 1)
    cl[r + 1] = c
    local z = {}
    for d = 1, D do
      z[d] = 0.5 * noise[r * D + d]
      xb[r * D + d - 1] = centres[c][d] + z[d]
    end
    for o = 1, D do
      local s = 0
      for d = 1, D do s = s + maps[c][(o - 1) * D + d] * z[d] end
      yb[r * D + o - 1] = math.tanh(s) + offsets[c][o]
    end
  end
  pool[p] = { x = xb, y = yb, cluster = cl }
end

-- ---- experts ----------------------------------------------------------------------------------
-- HostGroupedLinear: GroupedLinear's API (forward(x, m_splits), backward(dy), parameters) over
-- one nn.Linear per expert on the host: the --experts linear reference mode.
local HostGrouped = {}
HostGrouped.__index = HostGrouped
local function host_grouped(n, fin, fout, opts)
  local self = setmetatable({ n = n, fin = fin, fout = fout, linears = {}, rows = {} }, HostGrouped)
  for e = 1, n do
    self.linears[e] = nn.Linear(fin, fout, { seed = opts.seed + e, dtype = opts.dtype, device = opts.device })
  end
  self.device = opts.device
  return self
end

-- rows [first, first + count) of a host float buffer, zero-padded to padded rows (FP8 GEMMs need
-- row counts aligned to the recipe's blocks; GroupedLinear pads inside its kernels instead)
local function rows_of(t, first, count, padded, width)
  local buf = ffi.new("float[?]", padded * width)
  ffi.copy(buf, t + first * width, count * width * 4)
  return buf
end
local ALIGN = ({ none = 1, delayed = 16, current = 16, mxfp8 = 32, block = 128 })[opt.recipe] or 128
local function aligned(n) return math.ceil(n / ALIGN) * ALIGN end

function HostGrouped:forward(x, m_splits)
  local s = m_splits:bytes() -- the host read (a synchronization) this mode costs
  local splits = ffi.cast("const int32_t*", s)
  local xs = x:read()
  local rows = x:dims()[1]
  local out = ffi.new("float[?]", rows * self.fout)
  local first = 0
  for e = 1, self.n do
    local count = splits[e - 1]
    self.rows[e] = count
    if count > 0 then
      local xe = lutra.tensor({ aligned(count), self.fin }, "f32", self.device)
        :set(rows_of(xs, first, count, aligned(count), self.fin))
      local ye = self.linears[e]:forward(xe):read()
      ffi.copy(out + first * self.fout, ye, count * self.fout * 4)
    end
    first = first + count
  end
  self.out = self.out and self.out:dims()[1] == rows and self.out or lutra.tensor({ rows, self.fout }, "f32", self.device)
  return self.out:set(out)
end

function HostGrouped:backward(dy, input_grad)
  local g = dy:read()
  local rows = dy:dims()[1]
  local dx = ffi.new("float[?]", rows * self.fin)
  local first = 0
  for e = 1, self.n do
    local count = self.rows[e]
    if count > 0 then
      local ge = lutra.tensor({ aligned(count), self.fout }, "f32", self.device)
        :set(rows_of(g, first, count, aligned(count), self.fout))
      local de = self.linears[e]:backward(ge, input_grad)
      if de then ffi.copy(dx + first * self.fin, de:read(), count * self.fin * 4) end
    else
      self.linears[e]:zero_grad() -- an expert without rows this step has no gradient
    end
    first = first + count
  end
  if input_grad == false then return nil end
  self.dx = self.dx and self.dx:dims()[1] == rows and self.dx or lutra.tensor({ rows, self.fin }, "f32", self.device)
  return self.dx:set(dx)
end

local function make_experts(fin, fout, seed)
  local o = { seed = seed, device = dev }
  if opt.experts == "linear" then return host_grouped(E, fin, fout, o) end
  o.dtype = DT
  return nn.GroupedLinear(E, fin, fout, o)
end

-- optimizers over a module, or over each expert Linear of the reference mode
local function optimizers_of(m, list)
  if getmetatable(m) == HostGrouped then
    for _, l in ipairs(m.linears) do list[#list + 1] = lutra.optim.AdamW(l, { lr = opt.lr, weight_decay = 0 }) end
  else
    list[#list + 1] = lutra.optim.AdamW(m, { lr = opt.lr, weight_decay = 0 })
  end
end

-- ---- the layer ---------------------------------------------------------------------------------
local router = moe.Router(D, E, K, { seed = 11, device = dev, dtype = DT })
local disp = moe.Dispatcher(E, { device = dev })
local fc1, act, fc2 = make_experts(D, F, 20), nn.GELU(), make_experts(F, D, 40)
local opts = {}
optimizers_of(router.linear, opts)
optimizers_of(fc1, opts)
optimizers_of(fc2, opts)
local recipe = lutra.recipe.named(opt.recipe, opt.recipe == "delayed" and { amax_history_len = 16 } or nil)
local fp8 = lutra.autocast { recipe = recipe }
local loss = nn.MSELoss()
local x = lutra.tensor({ B, D }, DT, dev)
local target = lutra.tensor({ B, D }, DT, dev)

local function train_step()
  local probs, idx = router:forward(x)
  local xp, m_splits = disp:permute(x, idx)
  fp8:enter()
  local h = fc2:forward(act:forward(fc1:forward(xp, m_splits)), m_splits)
  fp8:exit()
  local y = disp:unpermute(h, probs)
  loss:forward(y, target)
  local dh, dprobs = disp:unpermute_backward(loss:backward())
  fc1:backward(act:backward(fc2:backward(dh)), false) -- the permuted rows are data here
  router:backward(dprobs, false)
  for i = 1, #opts do opts[i]:step() end
end

-- routing purity: for each cluster, the share of its rows whose top-1 expert is the cluster's
-- most frequent one; and how many experts are some cluster's favourite
local function routing()
  local counts = {}
  for c = 1, C do counts[c] = {} end
  for p = 1, POOL do
    x:set(pool[p].x)
    local _, idx = router:forward(x)
    local ids = ffi.cast("const int32_t*", idx:bytes())
    for r = 0, B - 1 do
      local c, e = pool[p].cluster[r + 1], ids[r * K]
      counts[c][e] = (counts[c][e] or 0) + 1
    end
  end
  local purity, favourites, distinct = 0, {}, 0
  for c = 1, C do
    local best, total, fav = 0, 0, -1
    for e, n in pairs(counts[c]) do
      total = total + n
      if n > best then best, fav = n, e end
    end
    purity = purity + (total > 0 and best / total or 0) / C
    if not favourites[fav] then distinct = distinct + 1 end
    favourites[fav] = true
  end
  return purity, distinct
end

print(string.format("lutra %s: top-%d MoE, %d experts (%s), %d clusters, batch %d, recipe %s, "
                    .. "graph %s, on %s", lutra.version(), K, E, opt.experts, C, B, opt.recipe,
                    opt.graph, dev))
local purity0 = routing() -- the router as initialised
local graph, first, last
for step = 1, opt.steps do
  local b = pool[(step - 1) % POOL + 1]
  x:set(b.x)
  target:set(b.y)
  if graph then
    graph:replay()
  elseif opt.graph == "on" and step > 1 then
    graph = lutra.graph.capture(train_step, { warmup = 0 })
    graph:replay()
  else
    train_step()
  end
  if step == 1 or step % opt.every == 0 or step == opt.steps then
    last = loss:value()
    disp:check()
    first = first or last
    print(string.format("step %5d  loss %.6f", step, last))
  end
end

local ratio = last / first
print(string.format("final loss %.6f = %.4f x the first (%.6f)", last, ratio, first))
local purity, distinct = routing()
print(string.format("routing: top-1 purity %.3f over %d clusters (%.3f at the start), %d distinct "
                    .. "favourite experts", purity, C, purity0, distinct))
if not (ratio < 0.2) or purity < 0.8 or distinct < math.min(C, E) / 2 then
  io.stderr:write("the MoE layer did not train or its experts did not specialise\n")
  os.exit(1)
end
