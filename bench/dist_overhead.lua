-- Process groups: host time per forward of column- and row-parallel Linear (with and without
-- sequence parallelism) beside the plain Linear of the shard's size and the raw collective
-- launch it issues (target: within 1.15x of Linear + collective), collectives per training step
-- of a 16-layer tensor-parallel MLP (counted), and the bytes the sequence-parallel all-gather
-- moves for FP8 codes against BF16.
--   CPU, 2 ranks over MPI:  mpirun --allow-run-as-root --oversubscribe -np 2 \
--                             luajit bench/dist_overhead.lua
--   CUDA, 1 rank over NCCL: NCCL_NVLS_ENABLE=0 luajit bench/dist_overhead.lua --device cuda
-- (with LUA_PATH="lua/?.lua;lua/?/init.lua;;"; `make bench-dist` runs the CPU one). Figures are
-- medians over 15 batches, printed by rank 0. OPENBLAS_NUM_THREADS=1 steadies the CPU ones.
-- --help lists the options (only --device cpu|cuda, default cpu); under mpirun only rank 0
-- prints the help or a command-line error.
local lutra = require("lutra")
local ffi, C, nn = lutra.ffi, lutra.C, lutra.nn

-- the command line, parsed with lua-argparse (Debian: lua-argparse) before MPI starts; under
-- mpirun every rank parses it, and only the launcher's rank 0 prints the help or the error
local function parse(argv)
  local found, argparse = pcall(require, "argparse")
  local launcher_rank = tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or os.getenv("PMI_RANK") or 0)
  local quiet = launcher_rank ~= 0
  if not found then
    if not quiet then
      io.stderr:write("dist_overhead.lua needs lua-argparse ",
                      "(Debian: apt-get install lua-argparse)\n")
    end
    os.exit(2)
  end
  local p = argparse("dist_overhead.lua", "Host time of the tensor-parallel Linear beside Linear "
                     .. "+ collective, collectives per step, SP all-gather bytes.")
  p:add_help({ action = function()
    if not quiet then print(p:get_help()) end
    os.exit(0)
  end })
  p:option("--device", "cpu (MPI ranks) or cuda (NCCL)", "cpu"):choices({ "cpu", "cuda" })
  function p:error(msg)
    if not quiet then io.stderr:write(("%s\n\nError: %s\n"):format(self:get_usage(), msg)) end
    os.exit(1)
  end
  return p:parse(argv)
end

local device = parse(arg).device

lutra.dist.init()
local world = lutra.dist.world()
local g = world:split(0, world:rank())
local rank, size = g:rank(), g:size()
local function say(...) if rank == 0 then io.write(string.format(...)) end end

local BATCHES = 15
local function median(t) table.sort(t) return t[(#t + 1) / 2] end
local function time_us(calls, fn)
  for _ = 1, calls do fn() end
  local ts = {}
  for b = 1, BATCHES do
    g:barrier()
    local t0 = lutra.now()
    for _ = 1, calls do fn() end
    ts[b] = (lutra.now() - t0) / calls * 1e6
  end
  if device == "cuda" then lutra.synchronize("cuda") end
  return median(ts)
end

local N, IN, OUT = 16, 64 * size, 64 * size
local CALLS = device == "cuda" and 2000 or 500
local args = ffi.new("lutra_forward_args")
C.lutra_forward_defaults(args)
local ybox = ffi.new("lutra_tensor*[1]")
local function fwd(m, x) return function() C.lutra_module_forward_ex(m, x, args, ybox) end end
local function tensor(shape, dtype) return lutra.tensor(shape, dtype or "f32", device):randn(rank) end

say("# dist overhead: %d rank(s), device %s; host us per forward (median of %d batches)\n",
    size, device, BATCHES)
say("%-34s %9s %9s %9s %9s %7s\n", "module", "parallel", "Linear", "collect.", "sum", "ratio")
local cases = {
  { "column", false, { N, IN }, IN, OUT / size, nil },
  { "column", true, { N, IN }, IN, OUT / size, "all_gather" },
  { "row", false, { N, IN / size }, IN / size, OUT, "all_reduce" },
  { "row", true, { N * size, IN / size }, IN / size, OUT, "reduce_scatter" },
}
for _, c in ipairs(cases) do
  local mode, sp, xshape, lin_in, lin_out, coll = unpack(c)
  local par = nn.Linear(IN, OUT, { parallel_mode = mode, tp_group = g, sequence_parallel = sp,
                                   device = device })
  local x = tensor(xshape)
  -- the plain Linear the shard runs: its GEMM's rows are the gathered rows (column + SP)
  local lin = nn.Linear(lin_in, lin_out, { device = device })
  local lx = tensor({ (mode == "column" and sp) and N * size or xshape[1], lin_in })
  local t_par = time_us(CALLS, fwd(par, x))
  local t_lin = time_us(CALLS, fwd(lin, lx))
  local t_coll = 0
  if coll == "all_gather" then
    local y = tensor({ N * size, IN })
    t_coll = time_us(CALLS, function() C.lutra_group_all_gather(g, x, y) end)
  elseif coll == "all_reduce" then
    local y = tensor({ N, OUT })
    t_coll = time_us(CALLS, function() C.lutra_group_all_reduce(g, y, C.LUTRA_REDUCE_SUM) end)
  elseif coll == "reduce_scatter" then
    local y, z = tensor({ N * size, OUT }), tensor({ N, OUT })
    t_coll = time_us(CALLS, function() C.lutra_group_reduce_scatter(g, y, z) end)
  end
  say("%-34s %9.2f %9.2f %9.2f %9.2f %7.2f\n",
      mode .. "-parallel" .. (sp and " + SP" or "") .. (coll and " (" .. coll .. ")" or ""),
      t_par, t_lin, t_coll, t_lin + t_coll, t_par / (t_lin + t_coll))
end

-- a 16-layer TP MLP (8 column/GELU/row blocks) under delayed scaling with the group
local H = 32 * size
local layers = {}
for i = 1, 8 do
  layers[#layers + 1] = nn.Linear(H, 4 * H, { parallel_mode = "column", tp_group = g, device = device })
  layers[#layers + 1] = nn.GELU()
  layers[#layers + 1] = nn.Linear(4 * H, H, { parallel_mode = "row", tp_group = g, device = device })
end
local mlp = nn.Sequential(unpack(layers))
local scope = lutra.autocast({ recipe = lutra.recipe.delayed(), group = g })
local x, dy = tensor({ 16, H }), tensor({ 16, H })
local function step() scope:enter() mlp:forward(x) scope:exit() mlp:backward(dy) end
step()
local s0 = g:stats()
local STEPS = 5
for _ = 1, STEPS do step() end
local s1 = g:stats()
local function per(k) return (s1[k] - s0[k]) / STEPS end
say("\n# 16-layer TP MLP (8 x column, GELU, row), delayed scaling, per training step:\n")
say("amax all-reduces %.0f (forward + backward), TP all-reduces %.0f, all-gathers %.0f, "
    .. "reduce-scatters %.0f\n", per("amax_reduce"), per("all_reduce") - per("amax_reduce"),
    per("all_gather"), per("reduce_scatter"))

-- bytes of the sequence-parallel all-gather: FP8 codes (TE's FP8 all-gather) against BF16
local SEQ, HID = 128, 256
local xb = lutra.tensor({ SEQ, HID }, "bf16", device):randn(rank)
local yb = lutra.tensor({ SEQ * size, HID }, "bf16", device)
local r = lutra.recipe.delayed()
local q_local = lutra.quantizer(r, "input", { columnwise = false, device = device })
local q_full = lutra.quantizer(r, "input", { columnwise = false, device = device })
local xq = q_local:quantize(xb)
local yq = q_full:quantize(yb)
local b0 = g:stats().bytes
g:all_gather(xb, yb)
local b1 = g:stats().bytes
g:all_gather(xq, yq)
local b2 = g:stats().bytes
say("\n# sequence-parallel all-gather of [%d, %d] per rank: BF16 %d bytes sent per rank, FP8 %d "
    .. "(%.2fx)\n", SEQ, HID, b1 - b0, b2 - b1, (b2 - b1) / (b1 - b0))
