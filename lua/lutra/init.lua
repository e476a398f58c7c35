--- lutra: FP8/BF16 training of linear layers from LuaJIT. See README.md for the API by example.
--
-- What require("lutra") returns. Beside the functions below it holds the other modules of this
-- reference under short names: lutra.tensor(shape, dtype, device) and lutra.from_table
-- (lutra.tensor's new and from_table), lutra.recipe, lutra.autocast{...} and
-- lutra.autocast_state / lutra.autocast_unwind / lutra.update_stats (lutra.autocast's new,
-- state, unwind, update_stats), lutra.quantizer(...) and lutra.dequantize (lutra.quantizer's new
-- and dequantize), lutra.nn, lutra.optim, lutra.moe, lutra.graph, lutra.dist, lutra.nvfp4,
-- lutra.rules, lutra.save and lutra.load (lutra.checkpoint's), lutra.wrap (lutra.wrap's),
-- lutra.norm_quantize (lutra.fused's), lutra.now() (a monotonic clock in seconds) and
-- lutra.default_device (LUTRA_DEVICE, "cpu" when unset). Errors are raised as "call: reason";
-- every object is left as it was.
--
-- FP8 shape rules. Inside an autocast scope a Linear quantizes its input, weight and output
-- gradient, and each FP8 operand must have both matrix dims (rows = the product of the leading
-- dims, and the last dim) a multiple of the recipe's granule, or the forward is refused with
-- "FP8 needs both matrix dims to be multiples of N": 16 for delayed and current scaling, 32 for
-- MXFP8 (1x32 blocks), and 128 for the blocks of block scaling to be full (1x128 blocks and
-- 128x128 weight tiles; multiples of 16 are accepted, and partial blocks are padded). So choose
-- batch (times sequence) sizes and layer widths as multiples of 16, 32 or 128 for the recipe.
--
-- Keep the first and last layers out of FP8. The layer that reads the raw data and the one that
-- produces the logits or predictions are the most sensitive to FP8's 3-bit (E4M3) mantissa, and
-- the first often has an input width that is not a multiple of 16. As TransformerEngine does,
-- run them in f32 or bf16 and only the layers in between in FP8: build the model in parts and
-- enter the autocast scope only around the middle part's forward (the backward needs no scope:
-- each Linear remembers how its forward quantized).
--
-- One optimizer over several modules. An optimizer takes one module and collects the
-- parameters of it and of its children; to train modules that are run separately (the parts
-- above, or an encoder and a head), give it a Sequential holding them. The Sequential is only
-- a container there: running the parts one by one is fine.
-- @module lutra
-- @usage
-- local lutra = require("lutra")
-- local nn = lutra.nn
-- local first = nn.Sequential(nn.Linear(20, 256), nn.GELU())     -- f32: raw input width 20
-- local middle = nn.Sequential(nn.Linear(256, 256), nn.GELU())   -- FP8
-- local last = nn.Linear(256, 10)                                -- f32: the logits
-- local opt = lutra.optim.AdamW(nn.Sequential(first, middle, last), {lr = 1e-3})
-- local fp8 = lutra.autocast{recipe = lutra.recipe.delayed{amax_history_len = 16}}
-- local loss = nn.CrossEntropyLoss()
-- local x = lutra.tensor({256, 20}):randn(1)                       -- 256 rows: FP8-friendly
-- local classes = {}
-- for i = 1, 256 do classes[i] = i % 10 end
-- local labels = lutra.from_table(classes, {256}, "i32")
-- for step = 1, 40 do
--   local h = first:forward(x)
--   h = fp8:run(function() return middle:forward(h) end)
--   loss:forward(last:forward(h), labels)
--   local d = last:backward(loss:backward())
--   first:backward(middle:backward(d), false)   -- false: x is data, no gradient for it
--   opt:step()
--   if step % 10 == 0 then print(step, loss:value()) end
-- end
local core = require("lutra.core")
local chk = require("lutra.check")
local tensor = require("lutra.tensor")
local autocast = require("lutra.autocast")
local quantizer = require("lutra.quantizer")

local C = core.C
local M = {
  C = C,
  ffi = core.ffi,
  tensor = tensor.new,
  from_table = tensor.from_table,
  recipe = require("lutra.recipe"),
  rules = require("lutra.rules"),
  autocast = autocast.new,
  autocast_state = autocast.state,
  autocast_unwind = autocast.unwind,
  update_stats = autocast.update_stats,
  quantizer = quantizer.new,
  dequantize = quantizer.dequantize,
  nn = require("lutra.nn"),
  optim = require("lutra.optim"),
  moe = require("lutra.moe"),
  graph = require("lutra.graph"),
  dist = require("lutra.dist"),
  nvfp4 = require("lutra.nvfp4"),
  default_device = core.default_device_name,
  now = core.now, -- monotonic wall clock in seconds
}
--- A monotonic wall clock (CLOCK_MONOTONIC), for progress lines and timing.
-- @treturn number seconds
-- @function now

M.norm_quantize = require("lutra.fused").norm_quantize
M.save = require("lutra.checkpoint").save -- checkpoints: lua/lutra/checkpoint.lua
M.load = require("lutra.checkpoint").load
M.export_onnx = require("lutra.onnx").export_onnx -- ONNX export: lua/lutra/onnx.lua
M.onnx_available = require("lutra.onnx").onnx_available
M.wrap = require("lutra.wrap").wrap -- caller-owned buffers: lua/lutra/wrap.lua
-- tensor ops (lua/lutra/tensor_ops.lua), written out: a loop here can be picked as a trace's
-- start (LuaJIT's hot counters are shared slots, so which loop gets hot depends on addresses),
-- and the closures made right after it abort that trace with an NYI the JIT specs count
local tensor_ops = require("lutra.tensor_ops")
M.add, M.sample, M.softmax, M.argmax = tensor_ops.add, tensor_ops.sample, tensor_ops.softmax,
                                       tensor_ops.argmax

-- transa/transb: true/false or "T"/"N". Anything else is refused: 0 is true in Lua, so
-- lutra.gemm(A, 0, B, 0, D) would otherwise have run TT.
local function trans_flag(v, name, where)
  if v == true or v == "T" then return 1 end
  if v == false or v == "N" then return 0 end
  error(string.format("%s: %s must be a boolean or \"N\"/\"T\" (got %s)", where, name,
                      chk.got(v)), 4)
end

local function gemm_args(a, transa, b, transb, d, bias, accumulate, where)
  chk.tensor(a, "A", where, 4)
  chk.tensor(b, "B", where, 4)
  chk.tensor(d, "D", where, 4)
  chk.tensor(bias, "bias", where, 4)
  local ta, tb = trans_flag(transa, "transa", where), trans_flag(transb, "transb", where)
  return ta, tb, chk.flag(accumulate, "accumulate", where, 0, 4)
end

--- D = op(B) @ op(A) (+ bias) (+ D): TransformerEngine's layout naming, see lutra.h.
function M.gemm(a, transa, b, transb, d, bias, accumulate)
  local ta, tb, acc = gemm_args(a, transa, b, transb, d, bias, accumulate, "lutra.gemm")
  core.check(C.lutra_gemm(a, ta, b, tb, d, bias, acc))
  return d
end

-- lutra.gemm_ex(A, transa, B, transb, D, {bias =, accumulate =, epilogue =, aux =, dbias =}):
-- lutra.gemm with a GEMM epilogue (lutra_gemm_epilogue in lutra.h). epilogue is "none" (the
-- default), "gelu", "gelu_aux" (aux receives the pre-activation), "dgelu" (aux is that
-- pre-activation), "dgelu_bgrad" (also dbias [n]) or "bgradb" (dbias [m] = k-sums of op(B)).
-- Returns D.
local epilogues = { none = C.LUTRA_EPILOGUE_NONE, gelu = C.LUTRA_EPILOGUE_GELU,
                    gelu_aux = C.LUTRA_EPILOGUE_GELU_AUX, dgelu = C.LUTRA_EPILOGUE_DGELU,
                    dgelu_bgrad = C.LUTRA_EPILOGUE_DGELU_BGRAD, bgradb = C.LUTRA_EPILOGUE_BGRADB }
local gemm_ex_options = { bias = true, accumulate = true, epilogue = true, aux = true, dbias = true }
local epilogue_box = core.ffi.new("lutra_gemm_epilogue")
--- lutra.gemm with a cuBLASLt epilogue, as TransformerEngine uses them.
--
-- @param a A
-- @param transa boolean or "N"/"T"
-- @param b B
-- @param transb boolean or "N"/"T"
--
-- @param d D, the output
--
-- @tparam[opt] table opts {bias =, accumulate =, epilogue =, aux =, dbias =}; epilogue: "none",
-- "gelu", "gelu_aux", "dgelu", "dgelu_bgrad" or "bgradb" (see the comment above)
--
-- @return d
function M.gemm_ex(a, transa, b, transb, d, opts)
  local where = "lutra.gemm_ex"
  opts = core.check_options(opts, gemm_ex_options, where)
  epilogue_box.kind = core.code(epilogues, opts.epilogue or "none", "epilogue", where)
  for _, key in ipairs { "aux", "dbias" } do
    if opts[key] ~= nil and not chk.is_tensor(opts[key]) then
      error(string.format("%s: %s must be a tensor", where, key), 2)
    end
  end
  local ta, tb, acc = gemm_args(a, transa, b, transb, d, opts.bias, opts.accumulate, where)
  epilogue_box.aux = opts.aux
  epilogue_box.dbias = opts.dbias
  local st = C.lutra_gemm_ex(a, ta, b, tb, d, opts.bias, acc, epilogue_box)
  -- drop the references before raising, so that the box never keeps tensors alive
  epilogue_box.aux, epilogue_box.dbias = nil, nil
  if st ~= 0 then core.fail() end
  return d
end

--- GEMM plans cached on this thread and the bytes of their workspaces.
--
-- @return plans, bytes
function M.gemm_cache_stats()
  local plans, bytes = core.ffi.new("int[1]"), core.ffi.new("size_t[1]")
  core.check(C.lutra_gemm_cache_stats(plans, bytes))
  return plans[0], tonumber(bytes[0])
end

--- eager cuda GEMMs replayed as cached one-GEMM graphs: (graphs cached, calls served by them)
function M.gemm_graph_stats()
  local g, l = core.ffi.new("int64_t[1]"), core.ffi.new("int64_t[1]")
  core.check(C.lutra_gemm_graph_stats(g, l))
  return tonumber(g[0]), tonumber(l[0])
end

--- eager cuda kernel launches (norms, casts, activations, losses...) replayed as cached graphs:
-- (graphs cached, calls served by them)
function M.launch_graph_stats()
  local g, l = core.ffi.new("int64_t[1]"), core.ffi.new("int64_t[1]")
  core.check(C.lutra_launch_graph_stats(g, l))
  return tonumber(g[0]), tonumber(l[0])
end

--- Seeds the global generator that unseeded fills (x:randn(), x:uniform()) and nn.Linear
-- without seed draw their seeds from: the same seed, the same draws.
function M.manual_seed(seed)
  chk.seed(seed, "seed", "lutra.manual_seed")
  core.check(C.lutra_manual_seed(seed))
end

--- Whether a backend can run here.
--
-- @tparam string name "cpu" or "cuda"
--
-- @treturn boolean
function M.device_available(name)
  return C.lutra_device_available(core.code(core.devices, name, "device", "lutra.device_available")) == 1
end

--- Waits for the device's queued work (for timing; host reads synchronize already).
function M.synchronize(name)
  core.check(C.lutra_device_synchronize(core.device(name, "lutra.synchronize")))
end

local memory_box = core.ffi.new("int64_t[2]")

--- Device memory lutra holds (lutra_device_memory): bytes in use now and the most since the last
-- reset; reset = true starts a new peak after reading. nil on the cpu, which does not count.
function M.device_memory(name, reset)
  local device = core.device(name, "lutra.device_memory")
  if device == C.LUTRA_CPU then return nil end
  core.check(C.lutra_device_memory(device, reset and 1 or 0, memory_box, memory_box + 1))
  return tonumber(memory_box[0]), tonumber(memory_box[1])
end

--- CUDA: run lutra's work on this cudaStream_t (a cdata pointer; nil: lutra's own stream).
function M.cuda_set_stream(stream)
  core.check(C.lutra_cuda_set_stream(stream))
end

--- lutra.set_skip_weight_update(device, skip): the device's skip-weight-update flag, which
-- forwards with is_first_microbatch "device" read when they run (true: keep the FP8 weights of
-- the last quantization). Stream-ordered, no synchronization; refused inside a graph capture.
function M.set_skip_weight_update(device, skip)
  if type(skip) ~= "boolean" then
    error("lutra.set_skip_weight_update: skip must be a boolean", 2)
  end
  core.check(C.lutra_set_skip_weight_update(core.device(device, "lutra.set_skip_weight_update"),
                                            skip and 1 or 0))
end

--- lutra.deterministic(on): the determinism switch (lutra/determinism.h): true makes the same
-- seeds give the same bits run after run (one OpenBLAS thread on the cpu; cuBLASLt algorithms
-- without split-K and cuDNN's deterministic attention backward on cuda). Returns the previous
-- setting; with no argument, only returns the current one. LUTRA_DETERMINISTIC=1 at load turns
-- it on.
function M.deterministic(on)
  local was = C.lutra_deterministic() == 1
  if on == nil then return was end
  if type(on) ~= "boolean" then
    error("lutra.deterministic: on must be a boolean (got " .. type(on) .. ")", 2)
  end
  core.check(C.lutra_set_deterministic(on and 1 or 0))
  return was
end

--- lutra.cpu_inference_pack(on): the CPU inference forward's packed weights
-- (lutra_cpu_set_inference_pack in lutra/base.h), off by default: true makes each f32 Linear's
-- inference forward (grad = false) multiply by a transposed copy of its weight, kept until the
-- weight changes (what ONNX Runtime's prepacking does; its bits may differ from the training
-- forward's in the last place). Returns the previous setting; with no argument, the current one.
function M.cpu_inference_pack(on)
  local was = C.lutra_cpu_inference_pack() == 1
  if on == nil then return was end
  if type(on) ~= "boolean" then
    error("lutra.cpu_inference_pack: on must be a boolean (got " .. type(on) .. ")", 2)
  end
  core.check(C.lutra_cpu_set_inference_pack(on and 1 or 0))
  return was
end

--- true when LUTRA_NVTX=1 was set when the library loaded (NVTX ranges are emitted)
function M.nvtx_active() return C.lutra_nvtx_active() == 1 end

--- The loaded library's version (lutra_version).
--
-- @treturn string "MAJOR.MINOR.PATCH"
function M.version()
  local b = core.int_box
  core.check(C.lutra_version(b, b + 1, b + 2))
  return string.format("%d.%d.%d", b[0], b[1], b[2])
end

return M
