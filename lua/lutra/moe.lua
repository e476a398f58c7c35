--- Mixture-of-experts routing (src/lutra/moe.h), all on the device: no host reads, buffers of
-- fixed size while shapes stay, so a router + permute + experts + unpermute step can be one CUDA
-- graph replayed with new routing.
--   local router = lutra.moe.Router(hidden, experts, 2)        -- Linear + fused softmax-top-k
--   local disp = lutra.moe.Dispatcher(experts)
--   local probs, idx = router:forward(x)
--   local xp, m_splits = disp:permute(x, idx)                   -- m_splits: i32, on the device
--   local h = experts_fc2:forward(act:forward(experts_fc1:forward(xp, m_splits)), m_splits)
--   local y = disp:unpermute(h, probs)
--   local dh, dprobs = disp:unpermute_backward(dy)
--   ... local dx = disp:permute_backward(dxp) (+ router:backward(dprobs))
-- Returned tensors belong to their router or dispatcher and keep it alive (as module outputs).
-- nn.MoEMLP (lua/lutra/transformer.lua) is this composition, with a norm in front, as one module.
-- @module lutra.moe
local core = require("lutra.core")
local chk = require("lutra.check")
local nn = require("lutra.nn")
local borrow = require("lutra.tensor").borrow
local ffi, C, check = core.ffi, core.C, core.check
local istype, tensor_t, struct_tensor_t = ffi.istype, chk.tensor_t, ffi.typeof("lutra_tensor")

local M = {}
local boxes = ffi.new("lutra_tensor*[2]")

local function bad_tensor(x)
  return x ~= nil and not istype(tensor_t, x) and not istype(struct_tensor_t, x)
end

-- ---- the fused softmax + top-k ------------------------------------------------------------
local TopK = {}
TopK.__index = TopK
local router_box = ffi.new("lutra_moe_router*[1]")
local router_desc = ffi.new("lutra_moe_router_desc")

--- The fused softmax + top-k of a router: each token's k largest logits and their
-- probabilities.
-- @tparam integer experts the logits' last dim
-- @tparam integer k the experts chosen per token, 1..experts
-- @tparam[opt] table opts {renormalize = true, scaling_factor = 1, device =}: renormalize =
-- false gives the full softmax at the k selected (TransformerEngine's use_pre_softmax), else
-- the softmax over the k selected; the probabilities are multiplied by scaling_factor
-- @return a TopK
function M.TopK(experts, k, opts)
  local where = "lutra.moe.TopK"
  opts = core.check_options(opts, { renormalize = true, scaling_factor = true, device = true },
                            where)
  chk.integer(experts, "experts", where, 1, 2 ^ 31 - 1)
  chk.integer(k, "k", where, 1, 2 ^ 31 - 1)
  C.lutra_moe_router_defaults(router_desc)
  router_desc.experts = experts
  router_desc.k = k
  router_desc.renormalize = chk.flag(opts.renormalize, "renormalize", where, 1)
  if opts.scaling_factor ~= nil then
    router_desc.scaling_factor = chk.finite(opts.scaling_factor, "scaling_factor", where)
  end
  router_desc.device = core.device(opts.device, where)
  check(C.lutra_moe_router_new(router_desc, router_box))
  return ffi.gc(router_box[0], C.lutra_moe_router_unref)
end

--- A fused softmax + top-k (lutra.moe.TopK).
-- @type TopK

--- The top-k of each token's logits.
-- @param logits [tokens, experts]
-- @return probs [tokens, k] f32, indices [tokens, k] i32 (owned by the TopK)
function TopK:forward(logits)
  if bad_tensor(logits) then chk.tensor(logits, "logits", "topk:forward") end
  if C.lutra_moe_router_forward(self, logits, boxes, boxes + 1) ~= 0 then core.fail() end
  return borrow(boxes[0], self), borrow(boxes[1], self)
end

--- The logits' gradient from the probabilities'.
-- @param dprobs [tokens, k]
-- @return dlogits [tokens, experts] (owned by the TopK)
function TopK:backward(dprobs)
  if bad_tensor(dprobs) then chk.tensor(dprobs, "dprobs", "topk:backward") end
  if C.lutra_moe_router_backward(self, dprobs, boxes) ~= 0 then core.fail() end
  return borrow(boxes[0], self)
end

--- Frees the buffers now; its outputs and later calls on it become errors.
function TopK:destroy() check(C.lutra_moe_router_destroy(self)) end

ffi.metatype("struct lutra_moe_router", { __index = TopK,
  __tostring = function() return "lutra.moe.TopK" end })

--- @section end

-- ---- permute / unpermute --------------------------------------------------------------------
local Dispatcher = {}
Dispatcher.__index = Dispatcher
local dispatch_box = ffi.new("lutra_moe_dispatch*[1]")

--- Permutes tokens into expert order (and back) for a GroupedLinear of the experts.
-- @tparam integer experts
-- @tparam[opt] table opts {device =}
-- @return a Dispatcher
function M.Dispatcher(experts, opts)
  local where = "lutra.moe.Dispatcher"
  opts = core.check_options(opts, { device = true }, where)
  chk.integer(experts, "experts", where, 1, 2 ^ 31 - 1)
  check(C.lutra_moe_dispatch_new(experts, core.device(opts.device, where), dispatch_box))
  return ffi.gc(dispatch_box[0], C.lutra_moe_dispatch_unref)
end

--- A token dispatcher (lutra.moe.Dispatcher). An index outside [0, experts) is an error at
-- once on the CPU; on a device it is flagged for dispatcher:check().
-- @type Dispatcher

--- Copies each token's row once per chosen expert, grouped by expert.
-- @param x [tokens, hidden]
-- @param indices [tokens, k] i32, as TopK's forward gives
-- @return permuted [tokens * k, hidden], m_splits (i32 [experts], on x's device: the rows of
-- each expert, for the experts' forward)
function Dispatcher:permute(x, indices)
  if bad_tensor(x) then chk.tensor(x, "x", "dispatcher:permute") end
  if bad_tensor(indices) then chk.tensor(indices, "indices", "dispatcher:permute") end
  if C.lutra_moe_permute(self, x, indices, boxes, boxes + 1) ~= 0 then core.fail() end
  return borrow(boxes[0], self), borrow(boxes[1], self)
end

--- The gradient of permute: each token's rows summed back.
-- @param dpermuted [tokens * k, hidden]
-- @return dx [tokens, hidden]
function Dispatcher:permute_backward(dpermuted)
  if bad_tensor(dpermuted) then chk.tensor(dpermuted, "dpermuted", "dispatcher:permute_backward") end
  if C.lutra_moe_permute_backward(self, dpermuted, boxes) ~= 0 then core.fail() end
  return borrow(boxes[0], self)
end

--- Sums each token's expert outputs weighted by its probabilities, back in token order.
-- @param expert_out [tokens * k, out]
-- @param probs [tokens, k]
-- @return y [tokens, out]
function Dispatcher:unpermute(expert_out, probs)
  if bad_tensor(expert_out) then chk.tensor(expert_out, "expert_out", "dispatcher:unpermute") end
  if bad_tensor(probs) then chk.tensor(probs, "probs", "dispatcher:unpermute") end
  if C.lutra_moe_unpermute(self, expert_out, probs, boxes) ~= 0 then core.fail() end
  return borrow(boxes[0], self)
end

--- The gradients of unpermute.
-- @param dy [tokens, out]
-- @return dexpert_out [tokens * k, out], dprobs [tokens, k]
function Dispatcher:unpermute_backward(dy)
  if bad_tensor(dy) then chk.tensor(dy, "dy", "dispatcher:unpermute_backward") end
  if C.lutra_moe_unpermute_backward(self, dy, boxes, boxes + 1) ~= 0 then core.fail() end
  return borrow(boxes[0], self), borrow(boxes[1], self)
end

--- The permuted row of each token's choices, from the last permute.
-- @return i32 [tokens, k] (-1: a bad index on a device)
function Dispatcher:row_map()
  check(C.lutra_moe_row_map(self, boxes))
  return borrow(boxes[0], self)
end

--- Raises when a device permute since the last check met an index outside [0, experts) (a host
-- read: call it where a synchronization is fine, e.g. with the loss value).
function Dispatcher:check() check(C.lutra_moe_dispatch_check(self)) end

--- Frees the buffers now; its outputs and later calls on it become errors.
function Dispatcher:destroy() check(C.lutra_moe_dispatch_destroy(self)) end

ffi.metatype("struct lutra_moe_dispatch", { __index = Dispatcher,
  __tostring = function() return "lutra.moe.Dispatcher" end })

--- @section end

-- ---- the router: a Linear (no bias by default, as Megatron's) and the fused top-k ----------
local Router = {}
Router.__index = Router

--- A router: a Linear (no bias by default, as Megatron's) giving the logits, and the fused
-- top-k. The Linear is a module of its own (router.linear: autocast, optimizers and
-- checkpoints see it as any Linear); the top-k (router.topk) takes its logits.
-- @tparam integer hidden the input's last dim
-- @tparam integer experts
-- @tparam integer k the experts chosen per token
-- @tparam[opt] table opts {bias = false, dtype, device, seed, renormalize, scaling_factor}
-- @return a Router
function M.Router(hidden, experts, k, opts)
  local where = "lutra.moe.Router"
  opts = core.check_options(opts, { bias = true, dtype = true, device = true, seed = true,
                                    renormalize = true, scaling_factor = true }, where)
  local linear = nn.Linear(hidden, experts, { bias = opts.bias == true, dtype = opts.dtype,
                                              device = opts.device, seed = opts.seed })
  local topk = M.TopK(experts, k, { renormalize = opts.renormalize,
                                    scaling_factor = opts.scaling_factor, device = opts.device })
  return setmetatable({ linear = linear, topk = topk }, Router)
end

--- A router (lutra.moe.Router): a Lua table holding its Linear and its TopK.
-- @type Router

--- The Linear, then the top-k.
-- @param x [tokens, hidden]
-- @param[opt] opts the Linear's forward options (Module:forward's second argument)
-- @return probs [tokens, k], indices [tokens, k] i32
function Router:forward(x, opts)
  return self.topk:forward(self.linear:forward(x, opts))
end

--- The top-k's backward, then the Linear's.
-- @param dprobs [tokens, k]
-- @param[opt] input_grad false: no gradient for x (returns nothing)
-- @return dx [tokens, hidden]
function Router:backward(dprobs, input_grad)
  return self.linear:backward(self.topk:backward(dprobs), input_grad)
end

--- The Linear's parameters (as Module:parameters).
function Router:parameters() return self.linear:parameters() end
--- What lutra.save / lutra.load take for a router: its Linear ("weight", "bias" when made with
-- one, its quantizers "fp8.input", ...); the top-k keeps no state across steps.
function Router:checkpoint_module() return self.linear end
--- Zeroes the Linear's accumulated main_grad buffers.
function Router:zero_grad() self.linear:zero_grad() end
--- Frees the Linear and the top-k now.
function Router:destroy()
  self.linear:destroy()
  self.topk:destroy()
end

return M
