-- lutra: FP8/BF16 training of linear layers from LuaJIT. See README.md for the API by example.
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
  graph = require("lutra.graph"),
  default_device = core.default_device_name,
  now = core.now, -- monotonic wall clock in seconds
}

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

-- D = op(B) @ op(A) (+ bias) (+ D): TransformerEngine's layout naming, see lutra.h.
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

function M.gemm_cache_stats()
  local plans, bytes = core.ffi.new("int[1]"), core.ffi.new("size_t[1]")
  core.check(C.lutra_gemm_cache_stats(plans, bytes))
  return plans[0], tonumber(bytes[0])
end

-- eager cuda GEMMs replayed as cached one-GEMM graphs: (graphs cached, calls served by them)
function M.gemm_graph_stats()
  local g, l = core.ffi.new("int64_t[1]"), core.ffi.new("int64_t[1]")
  core.check(C.lutra_gemm_graph_stats(g, l))
  return tonumber(g[0]), tonumber(l[0])
end

-- Seeds the global generator that unseeded fills (x:randn(), x:uniform()) and nn.Linear
-- without seed draw their seeds from: the same seed, the same draws.
function M.manual_seed(seed)
  chk.seed(seed, "seed", "lutra.manual_seed")
  core.check(C.lutra_manual_seed(seed))
end

function M.device_available(name)
  return C.lutra_device_available(core.code(core.devices, name, "device", "lutra.device_available")) == 1
end

-- Waits for the device's queued work (for timing; host reads synchronize already).
function M.synchronize(name)
  core.check(C.lutra_device_synchronize(core.device(name, "lutra.synchronize")))
end

-- CUDA: run lutra's work on this cudaStream_t (a cdata pointer; nil: lutra's own stream).
function M.cuda_set_stream(stream)
  core.check(C.lutra_cuda_set_stream(stream))
end

-- lutra.set_skip_weight_update(device, skip): the device's skip-weight-update flag, which
-- forwards with is_first_microbatch "device" read when they run (true: keep the FP8 weights of
-- the last quantization). Stream-ordered, no synchronization; refused inside a graph capture.
function M.set_skip_weight_update(device, skip)
  if type(skip) ~= "boolean" then
    error("lutra.set_skip_weight_update: skip must be a boolean", 2)
  end
  core.check(C.lutra_set_skip_weight_update(core.device(device, "lutra.set_skip_weight_update"),
                                            skip and 1 or 0))
end

-- true when LUTRA_NVTX=1 was set when the library loaded (NVTX ranges are emitted)
function M.nvtx_active() return C.lutra_nvtx_active() == 1 end

function M.version()
  local b = core.int_box
  core.check(C.lutra_version(b, b + 1, b + 2))
  return string.format("%d.%d.%d", b[0], b[1], b[2])
end

return M
