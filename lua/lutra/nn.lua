--- Modules (C objects with a forward/backward protocol, as torch/nn's) and losses.
--   local net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))
--   local y = net:forward(x)          -- output buffer owned by the module, reused
--   local dx = net:backward(dy)
-- Forward holds its input until the next forward (the GC cannot free it before the backward);
-- keep it unchanged until the backward. Returned tensors belong to the module (or loss) and
-- keep it alive while referenced; after module:destroy(), or once a later forward with a new shape
-- replaced the buffer, using them is an error ("tensor ... was freed").
-- nn.LayerNormLinear, nn.LayerNormMLP and nn.Residual are lutra.fused's; nn.GroupedLinear is
-- lutra.grouped's. Methods are looked up per module kind: Module's on every module, a kind's
-- own (Linear's, Sequential's, ...) on that kind only.
-- @module lutra.nn
local core = require("lutra.core")
local chk = require("lutra.check")
local borrow, owners = require("lutra.tensor").borrow, require("lutra.tensor").owners
local ffi, C, check = core.ffi, core.C, core.check
local grouped = require("lutra.grouped")
local attention = require("lutra.attention")
local methods = require("lutra.module_methods")
local lua_module = require("lutra.lua_module")
local istype, tensor_t, struct_tensor_t = ffi.istype, chk.tensor_t, ffi.typeof("lutra_tensor")

local M = {}
local Module, Linear, Sequential, Embedding = {}, {}, {}, {}

local module_box = ffi.new("lutra_module*[1]")

local function own(m) return ffi.gc(m, C.lutra_module_unref) end

--- A fully connected layer: y = x W^T + b over the last dim. Inside an autocast scope it
-- computes in the recipe's FP8 (or NVFP4). Without seed the weights' seed comes from the global
-- generator (lutra.manual_seed), so two layers of one shape start different.
-- @tparam integer in_features the input's last dim
-- @tparam integer out_features the output's last dim
-- @tparam[opt] table opts {bias = true, dtype = "f32" | "bf16", device =, seed =,
-- accumulate_main_grad = false (an f32 main_grad that backwards add into), name = (for a
-- factory recipe), parallel_mode = "column" | "row", tp_group =, sequence_parallel = false
-- (tensor parallel, lutra.dist: the features given are the full layer's), weight = (weight
-- tying: a module, an Embedding or a Linear (the module, not its tensor: the Linear keeps it
-- alive), whose weight this Linear uses as its own: GPT's LM head
-- nn.Linear(dim, vocab, {bias = false, weight = emb}). The shape must be {out_features,
-- in_features}, dtype, device and accumulate_main_grad the same. One gradient buffer: after a
-- step's forwards and backwards, in any order, it holds the sum of both modules' parts (a
-- backward overwrites it unless the other module wrote it since this one's forward); a
-- Sequential and its optimizer list the weight once, checkpoints store it once (see
-- lutra_linear_desc.tie in lutra/nn.h))}
-- @return the module
function M.Linear(in_features, out_features, opts)
  local where = "lutra.nn.Linear"
  opts = core.check_options(opts, { bias = true, dtype = true, device = true, seed = true,
                                    accumulate_main_grad = true, parallel_mode = true,
                                    tp_group = true, sequence_parallel = true, name = true,
                                    weight = true }, where)
  -- 2^53: exact in a Lua number; the C side refuses sizes it cannot allocate
  chk.integer(in_features, "in_features", where, 1, 2 ^ 53)
  chk.integer(out_features, "out_features", where, 1, 2 ^ 53)
  local d = ffi.new("lutra_linear_desc")
  C.lutra_linear_defaults(d)
  d.in_features = in_features
  d.out_features = out_features
  d.bias = chk.flag(opts.bias, "bias", where, d.bias)
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  -- without a seed, lutra_linear_defaults drew one from the global generator
  if opts.seed ~= nil then d.seed = chk.seed(opts.seed, "seed", where) end
  d.accumulate_main_grad = chk.flag(opts.accumulate_main_grad, "accumulate_main_grad", where, 0)
  -- the tied module stays referenced by d (a local) until the C call has taken its own reference
  local tie = opts.weight
  if tie ~= nil and not chk.is_module(tie) then
    error(string.format("%s: weight must be the module (an Embedding or a Linear) whose weight "
                        .. "to share (got %s)", where, chk.is_tensor(tie)
                        and "a tensor: pass the module that owns it" or chk.got(tie)), 2)
  end
  d.tie = tie
  -- name: for a factory recipe (lutra.recipe.custom{factory = ...})
  if opts.name ~= nil then chk.string(opts.name, "name", where) end
  -- tensor parallel (lua/lutra/dist.lua): in_features/out_features are the full layer's
  if opts.parallel_mode ~= nil or opts.tp_group ~= nil or opts.sequence_parallel ~= nil then
    check(C.lutra_linear_parallel_new(d, require("lutra.dist").tp_desc(opts, where), module_box))
    return core.set_name(own(module_box[0]), opts.name)
  end
  check(C.lutra_linear_new(d, module_box))
  return core.set_name(own(module_box[0]), opts.name)
end

--- A lookup table (torch's nn.Embedding): forward(ids) takes i32 ids of 1 to 3 dims on the
-- module's device and gives ids' shape + {dim} in the module's dtype; backward(dy) writes the
-- weight gradient (deterministic: each row's contributions summed in f32 in position order, the
-- same bits on cpu and cuda) and returns nil (ids are data). The weight starts N(0, 1); without
-- seed its seed comes from the global generator. Out-of-range ids: refused at the call on cpu;
-- on cuda they set a device flag that m:check() reads (see Embedding:check).
-- @tparam integer num_embeddings the number of rows (ids lie in [0, num_embeddings))
-- @tparam integer dim the length of each row
-- @tparam[opt] table opts {dtype = "f32" | "bf16" | "f16", device =, seed =,
-- accumulate_main_grad = false (an f32 main_grad that backwards add into)}
-- @return the module
function M.Embedding(num_embeddings, dim, opts)
  local where = "lutra.nn.Embedding"
  opts = core.check_options(opts, { dtype = true, device = true, seed = true,
                                    accumulate_main_grad = true }, where)
  chk.integer(num_embeddings, "num_embeddings", where, 1, 2 ^ 31 - 1)
  chk.integer(dim, "dim", where, 1, 2 ^ 31 - 1)
  local d = ffi.new("lutra_embedding_desc")
  C.lutra_embedding_defaults(d)
  d.num_embeddings, d.dim = num_embeddings, dim
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  -- without a seed, lutra_embedding_defaults drew one from the global generator
  if opts.seed ~= nil then d.seed = chk.seed(opts.seed, "seed", where) end
  d.accumulate_main_grad = chk.flag(opts.accumulate_main_grad, "accumulate_main_grad", where, 0)
  check(C.lutra_embedding_new(d, module_box))
  return own(module_box[0])
end

-- ---- activations (TransformerEngine's set; src/nn/activation.c) ----

--- nn.GELU{approximate = "tanh" | "none"}: "tanh" (the default, TE's "gelu" and the one a Linear
-- before it runs in its GEMM epilogue) or "none", the exact 0.5 x (1 + erf(x / sqrt 2)).
function M.GELU(opts)
  local where = "lutra.nn.GELU"
  opts = core.check_options(opts, { approximate = true }, where)
  local approx = opts.approximate
  if approx == nil or approx == "tanh" then
    check(C.lutra_gelu_new(module_box))
  elseif approx == "none" then
    check(C.lutra_activation_new(C.LUTRA_ACTIVATION_GELU_ERF, module_box))
  else
    error(string.format("%s: approximate must be \"tanh\" or \"none\" (got %s)", where,
                        tostring(approx)), 2)
  end
  return own(module_box[0])
end

-- nn.LayerNorm(hidden, {eps=1e-5, zero_centered_gamma=false, dtype="f32", device=}) and
-- nn.RMSNorm(hidden, {...}): over the last dim; parameters weight (and LayerNorm's bias) of
-- dtype (f32 or bf16), the input of that dtype. zero_centered_gamma: the weight stored is
-- gamma - 1 (TransformerEngine's), starting at zeros.
local norm_box = ffi.new("lutra_norm_desc")
local function new_norm(hidden, opts, rms, where)
  opts = core.check_options(opts, { eps = true, zero_centered_gamma = true, dtype = true,
                                    device = true }, where)
  chk.integer(hidden, "hidden", where, 1, 2 ^ 53, 4)
  C.lutra_norm_defaults(norm_box)
  norm_box.hidden = hidden
  norm_box.rms = rms
  if opts.eps ~= nil then
    chk.finite(opts.eps, "eps", where, 4)
    if opts.eps < 0 then chk.fail(where, "eps must be >= 0 (got %s)", tostring(opts.eps)) end
    norm_box.eps = opts.eps
  end
  norm_box.zero_centered_gamma = chk.flag(opts.zero_centered_gamma, "zero_centered_gamma",
                                          where, 0, 4)
  if opts.dtype ~= nil then norm_box.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  norm_box.device = core.device(opts.device, where)
  check(C.lutra_layernorm_new(norm_box, module_box))
  return own(module_box[0])
end

--- LayerNorm over the last dim (see the comment above).
--
-- @tparam integer hidden
-- @tparam[opt] table opts {eps = 1e-5, zero_centered_gamma = false,
-- dtype = "f32", device =}
function M.LayerNorm(hidden, opts) return new_norm(hidden, opts, 0, "lutra.nn.LayerNorm") end
--- RMSNorm over the last dim: LayerNorm's options, no bias.
--
-- @tparam integer hidden
-- @tparam[opt] table opts
function M.RMSNorm(hidden, opts) return new_norm(hidden, opts, 1, "lutra.nn.RMSNorm") end

local function activation(kind, where)
  return function(...)
    if select("#", ...) > 0 then error(where .. ": takes no arguments", 2) end
    check(C.lutra_activation_new(kind, module_box))
    return own(module_box[0])
  end
end
--- nn.ReLU(): max(x, 0).
-- @function ReLU
M.ReLU = activation(C.LUTRA_ACTIVATION_RELU, "lutra.nn.ReLU")
--- nn.SiLU(): x sigmoid(x).
-- @function SiLU
M.SiLU = activation(C.LUTRA_ACTIVATION_SILU, "lutra.nn.SiLU")
--- nn.QuickGELU(): x sigmoid(1.702 x).
-- @function QuickGELU
M.QuickGELU = activation(C.LUTRA_ACTIVATION_QGELU, "lutra.nn.QuickGELU")
--- nn.SquaredReLU(): relu(x)^2.
-- @function SquaredReLU
M.SquaredReLU = activation(C.LUTRA_ACTIVATION_SRELU, "lutra.nn.SquaredReLU")
--- nn.Tanh(): tanh(x).
-- @function Tanh
M.Tanh = activation(C.LUTRA_ACTIVATION_TANH, "lutra.nn.Tanh")
-- gated: the input's last dim 2h is split into the gate (first half) and the linear part

--- nn.SwiGLU(): silu(a) b, gated: the last dim 2h is split into a (first half, the gate) and b; gives h.
-- @function SwiGLU
M.SwiGLU = activation(C.LUTRA_ACTIVATION_SWIGLU, "lutra.nn.SwiGLU")
--- nn.GeGLU(): gelu_tanh(a) b, gated as SwiGLU.
-- @function GeGLU
M.GeGLU = activation(C.LUTRA_ACTIVATION_GEGLU, "lutra.nn.GeGLU")
--- nn.ReGLU(): relu(a) b, gated as SwiGLU.
-- @function ReGLU
M.ReGLU = activation(C.LUTRA_ACTIVATION_REGLU, "lutra.nn.ReGLU")
-- ---- end activations ----

-- a C Sequential of n C modules (errors at the caller of nn.Sequential)
local function c_sequential(mods, n)
  local arr = ffi.new("lutra_module*[?]", math.max(n, 1))
  for i = 1, n do
    -- nil passes on: lutra_sequential_new names the NULL entry itself
    if mods[i] ~= nil and not chk.is_module(mods[i]) then
      error(string.format("lutra.nn.Sequential: argument %d must be a module (got %s)", i,
                          chk.got(mods[i])), 3)
    end
    arr[i - 1] = mods[i]
  end
  check(C.lutra_sequential_new(arr, n, module_box))
  return require("lutra.module_tree").own_ref(module_box[0]) -- indexable: seq[i], #seq
end

--- A chain of modules, run in order; it holds a reference to each. A Linear followed by a
-- GELU runs as one GEMM with the GELU in its epilogue. With a module written in Lua among them
-- (lutra.lua_module: nn.Module), a Sequential in Lua that runs each run of C modules as one C
-- Sequential.
--
-- @param ... modules
function M.Sequential(...)
  local mods = { ... }
  local n = select("#", ...)
  for i = 1, n do
    if type(mods[i]) == "table" then
      local ok, s = pcall(lua_module.Sequential, mods, n, c_sequential)
      if not ok then error(s, 2) end
      return s
    end
  end
  return c_sequential(mods, n)
end

-- nn.Module(name): a class of modules written in Lua (lutra.lua_module.class). A callable
-- table, not a function: the constructors of C modules are the functions of this table.
M.Module = setmetatable({}, { __call = function(_, name) return lua_module.class(name) end })

-- The second argument is is_first_microbatch, or a table of forward options:
--   is_first_microbatch  nil (always quantize weights), true (quantize and cache), false (reuse),
--                        "device" (quantize unless the device's skip-weight-update flag is set
--                        when the work runs: lutra.set_skip_weight_update; for CUDA graphs of
--                        gradient accumulation)
--   grad                 false: an inference forward, no backward follows (default true)
-- e.g. net:forward(x, true) or net:forward(x, {is_first_microbatch = false, grad = false}).
local forward_args = ffi.new("lutra_forward_args")

-- a tensor or nil (C refuses NULL naming itself); inline so that traces keep no call frame
local function bad_tensor(x)
  return x ~= nil and not istype(tensor_t, x) and not istype(struct_tensor_t, x)
end

local function microbatch_flag(v)
  if v == nil then return -1 end
  if v == true then return 1 end
  if v == false then return 0 end
  if v == "device" then return C.LUTRA_FIRST_MICROBATCH_DEVICE end
  error("module:forward: is_first_microbatch must be nil, true, false or \"device\" (got "
        .. tostring(v) .. ")", 3)
end

--- The methods every module has (nn.Linear, nn.Sequential, norms, activations, the fused and
-- grouped modules). A kind's own methods are listed under its name (Linear and Sequential here,
-- LayerNormLinear and LayerNormMLP in lutra.fused, GroupedLinear in lutra.grouped); calling
-- one on a module of another kind is an error naming both, e.g. "Linear has no method
-- 'set_splits' (it is a method of GroupedLinear)". print(module) shows the module tree.
-- @type Module

--- Runs the module on x and returns its output (owned by the module, reused by the next call).
-- Inside an entered autocast scope, Linears compute in its recipe's FP8.
--
-- @param x the input tensor
--
-- @param[opt] opts is_first_microbatch (nil, true, false or "device") or a table
-- {is_first_microbatch =, grad =} (see the comment above); for a GroupedLinear, or a
-- Sequential holding GroupedLinears (each gets them), m_splits (a table, a host or a device i32
-- tensor)
-- @param[opt] grouped_opts for a GroupedLinear: the options table that follows m_splits
-- @param[opt] attn_opts for a DotProductAttention's forward(q, k, v, opts) (lutra.attention)
-- @return the output tensor
function Module:forward(x, opts, grouped_opts, attn_opts)
  if bad_tensor(x) then chk.tensor(x, "input", "module:forward") end
  if grouped_opts ~= nil and not bad_tensor(grouped_opts) then -- forward(q, k, v)
    return attention.forward(self, x, opts, grouped_opts, attn_opts)
  end
  -- GroupedLinear: forward(x, m_splits, opts)
  local splits
  if grouped.is_splits(opts) then
    splits, opts = grouped.splits_tensor(self, opts), grouped_opts
  end
  local grad = true
  local first = opts
  if type(opts) == "table" then
    first = opts.is_first_microbatch
    if opts.grad ~= nil then
      if type(opts.grad) ~= "boolean" then
        error("module:forward: grad must be a boolean (got " .. tostring(opts.grad) .. ")", 2)
      end
      grad = opts.grad
    end
  end
  forward_args.is_first_microbatch = microbatch_flag(first)
  forward_args.grad = grad and 1 or 0
  local st = splits and C.lutra_grouped_forward(self, x, splits, forward_args, core.tensor_box)
             or C.lutra_module_forward_ex(self, x, forward_args, core.tensor_box)
  if st ~= 0 then
    -- a factory recipe's module met for the first time: its choice, then the forward again
    -- (once per module that waits; the failed attempt did nothing)
    while core.resolve_factory and core.resolve_factory() do
      st = splits and C.lutra_grouped_forward(self, x, splits, forward_args, core.tensor_box)
           or C.lutra_module_forward_ex(self, x, forward_args, core.tensor_box)
      if st == 0 then return borrow(core.tensor_box[0], self) end
    end
    core.fail()
  end
  return borrow(core.tensor_box[0], self)
end

--- Runs the backward of the last forward: the parameters' gradients (grad, and main_grad
-- where accumulated) and the input's.
-- @param dy the output's gradient, of the output's shape
-- @param[opt] input_grad false: the input's gradient is not wanted (the input is data): a
-- Linear skips its dgrad GEMM, and nothing is returned
-- @return the input's gradient (owned by the module, reused by the next call); dq, dk, dv
-- after a DotProductAttention's forward(q, k, v)
function Module:backward(dy, input_grad)
  if bad_tensor(dy) then chk.tensor(dy, "grad_output", "module:backward") end
  if methods.kind_of(self) == attention.kind then
    local ran, dq, dk, dv = attention.backward(self, dy, input_grad)
    if ran then return dq, dk, dv end
  end
  if input_grad ~= nil and input_grad ~= true and input_grad ~= false then
    chk.boolean(input_grad, "input_grad", "module:backward")
  end
  if input_grad == false then
    if C.lutra_module_backward(self, dy, nil) ~= 0 then core.fail() end
    return nil
  end
  if C.lutra_module_backward(self, dy, core.tensor_box) ~= 0 then core.fail() end
  return borrow(core.tensor_box[0], self)
end

--- Zeroes the parameters' gradients and the accumulated main_grad buffers
-- (accumulate_main_grad Linears).
function Module:zero_grad()
  if C.lutra_module_zero_grad(self) ~= 0 then core.fail() end
end

--- The module's parameters and their gradients, its children's included, in order.
-- @treturn table {{value =, grad =, main_grad =}, ...}: tensors owned by the module (main_grad
-- only where accumulate_main_grad)
function Module:parameters()
  check(C.lutra_module_num_params(self, core.int_box))
  local out, p = {}, ffi.new("lutra_param")
  for i = 0, core.int_box[0] - 1 do
    check(C.lutra_module_param(self, i, p))
    out[i + 1] = { value = borrow(p.value, self), grad = borrow(p.grad, self),
                   main_grad = p.main_grad ~= nil and borrow(p.main_grad, self) or nil }
  end
  return out
end

--- The module's kind as C names it.
-- @treturn string e.g. "linear", "sequential", "grouped_linear", "gelu"
function Module:kind() return ffi.string(C.lutra_module_kind(self)) end

--- Frees the module's buffers now; its outputs and later calls on it become errors. Refused
-- while a Sequential or an optimizer still uses it.
function Module:destroy() check(C.lutra_module_destroy(self)) end

--- A Sequential's own methods (nn.Sequential), beside Module's. A Sequential is indexed:
-- seq[i] is its i-th child (1-based; a handle that keeps the Sequential alive), #seq the
-- number of children.
-- @type Sequential

local fusion_box = ffi.new("int[2]")
--- How many activations the last forward and backward ran inside a neighbour, with no kernel
-- of their own: a GEMM epilogue (the tanh GELU: GELU_AUX in forward, DGELU in the next
-- Linear's dgrad, an FP8 one with per-tensor scaling too where its GEMM runs DGELU) or an FP8
-- cast (every kind, per-tensor scaling: act inside the next Linear's input cast, act' inside the
-- previous Linear's grad_output cast).
-- @return forward, backward: counts
function Sequential:fusions()
  check(C.lutra_sequential_fusions(self, fusion_box, fusion_box + 1))
  return fusion_box[0], fusion_box[1]
end

--- A Linear's own methods (nn.Linear), beside Module's.
-- @type Linear

--- The quantizer a role used in the last forward/backward (owned by the module). The handle
-- keeps the module alive; once the module rebuilt its quantizers (a new recipe) or was freed,
-- calls on it fail with "quantizer was freed".
-- @tparam string role "input", "weight" or "grad_output"
-- @return the quantizer, or nil when the role ran in high precision
function Linear:quantizer(role)
  local box = ffi.new("lutra_quantizer*[1]")
  check(C.lutra_linear_quantizer(self, core.code(core.roles, role, "role", "module:quantizer"), box))
  if box[0] == nil then return nil end
  C.lutra_quantizer_retain(box[0])
  local q = ffi.gc(box[0], C.lutra_quantizer_unref)
  owners[q] = self
  return q
end

--- The FP8 tensor its last forward quantized for a role (owned by the module).
-- @tparam string role "input" or "weight"
-- @return the FP8 tensor, or nil when the last forward ran in high precision
function Linear:quantized(role)
  check(C.lutra_linear_quantized(self, core.code(core.roles, role, "role", "module:quantized"),
                                 core.tensor_box))
  if core.tensor_box[0] == nil then return nil end
  return borrow(core.tensor_box[0], self)
end

--- An Embedding's own method (nn.Embedding), beside Module's.
-- @type Embedding

--- On cuda, reads and clears the device flag that the forwards since the last check set for an
-- id outside [0, num_embeddings) (their output rows were NaN, the backward skipped them), and
-- raises an error naming the range if one was set. A host read: it waits for the GPU. Nothing to
-- read on cpu, which refuses such ids at the call.
function Embedding:check() check(C.lutra_embedding_check(self)) end

-- ---- the norm-fused modules (lua/lutra/fused.lua) ----
local fused = require("lutra.fused")
M.LayerNormLinear, M.LayerNormMLP = fused.LayerNormLinear, fused.LayerNormMLP
M.Residual = fused.Residual
-- ---- end norm-fused modules ----

-- GroupedLinear: nn.GroupedLinear(num_gemms, in, out, opts); m:forward(x, m_splits, opts)
M.GroupedLinear = grouped.GroupedLinear
-- RotaryEmbedding: nn.RotaryEmbedding(head_dim, opts) (lua/lutra/rope.lua)
M.RotaryEmbedding = require("lutra.rope").RotaryEmbedding
M.DotProductAttention = attention.DotProductAttention -- lua/lutra/attention.lua
-- MultiheadAttention, TransformerLayer (lua/lutra/transformer.lua)
local transformer = require("lutra.transformer")
M.MultiheadAttention, M.TransformerLayer = transformer.MultiheadAttention, transformer.TransformerLayer
M.MoEMLP = transformer.MoEMLP -- the mixture-of-experts feed-forward (src/lutra/moe_mlp.h)

-- Methods per kind (lua/lutra/module_methods.lua): Module's on every module, the kind's own
-- beside them; fused.lua and grouped.lua define their kinds. The C kind names are
-- lutra_module_kind's.
methods.define("linear", "Linear", Linear)
methods.define("sequential", "Sequential", Sequential, true)
methods.define("embedding", "Embedding", Embedding)
attention.kind = methods.define("dot_product_attention", "DotProductAttention", attention.methods)
methods.define("multihead_attention", "MultiheadAttention", { part = transformer.part })
methods.define("transformer_layer", "TransformerLayer", { part = transformer.part })
methods.define("moe_mlp", "MoEMLP", transformer.moe_methods)
for kind, name in pairs { linear_parallel = "Linear (tensor parallel)", layernorm = "LayerNorm",
                          rmsnorm = "RMSNorm", gelu = "GELU", gelu_erf = "GELU", relu = "ReLU",
                          silu = "SiLU", quick_gelu = "QuickGELU", squared_relu = "SquaredReLU",
                          swiglu = "SwiGLU", geglu = "GeGLU", reglu = "ReGLU", tanh = "Tanh",
                          rotary_qkv = "MultiheadAttention's RoPE step",
                          moe_router = "MoEMLP's router (a Linear, never FP8)" } do
  methods.define(kind, name)
end

-- print(module) shows the tree; a Sequential is indexed seq[i] (1-based) and #seq
-- (lutra/module_tree.lua)
local tree = require("lutra.module_tree")
ffi.metatype("struct lutra_module", { __index = methods.index(Module, tree.child),
  __len = tree.count, __tostring = tree.tostring })

-- Losses: forward(pred, target) -> loss tensor [1]; backward() -> dpred; value() -> number
local Loss = {}
Loss.__index = Loss
local loss_box = ffi.new("lutra_loss*[1]")

local function new_loss(kind)
  check(C.lutra_loss_new(kind, loss_box))
  return ffi.gc(loss_box[0], C.lutra_loss_unref)
end

--- @section end

--- Mean squared error over all elements; target has pred's shape.
function M.MSELoss() return new_loss(C.LUTRA_LOSS_MSE) end
--- Softmax cross-entropy, mean over rows; pred [N, C], target i32 labels [N].
function M.CrossEntropyLoss() return new_loss(C.LUTRA_LOSS_SOFTMAX_XENT) end

--- A loss (nn.MSELoss, nn.CrossEntropyLoss): forward(pred, target), backward(), value().
-- @type Loss

--- Computes the loss of pred against target.
--
-- @param pred
-- @param target
-- @return the loss, a one-element tensor owned by the loss
function Loss:forward(pred, target)
  if bad_tensor(pred) then chk.tensor(pred, "pred", "loss:forward") end
  if bad_tensor(target) then chk.tensor(target, "target", "loss:forward") end
  if C.lutra_loss_forward(self, pred, target, core.tensor_box) ~= 0 then core.fail() end
  return borrow(core.tensor_box[0], self)
end

--- The gradient of the loss with respect to pred (owned by the loss).
function Loss:backward()
  if C.lutra_loss_backward(self, core.tensor_box) ~= 0 then core.fail() end
  return borrow(core.tensor_box[0], self)
end

--- The last forward's loss as a number (a host read: on cuda it waits for the GPU).
function Loss:value()
  if C.lutra_loss_value(self, core.float_box) ~= 0 then core.fail() end
  return core.float_box[0]
end

--- Frees the loss now.
function Loss:destroy() check(C.lutra_loss_destroy(self)) end

ffi.metatype("struct lutra_loss", { __index = Loss })

return M
