--- Optimizers in C over all parameters of a module in one call per step, with the learning-rate
-- schedule, global-norm gradient clipping and weight-decay groups inside the step (on cuda a
-- captured step replays them: the lr follows the schedule at every replay).
--   local opt = lutra.optim.AdamW(net, {lr = 3e-4, weight_decay = 0.1, max_grad_norm = 1.0,
--                                       schedule = {warmup = 100, total = 5000, min_lr = 3e-5}})
--   opt:step()
--   print(opt:lr(), opt:grad_norm())
-- @module lutra.optim
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Optim = {}
Optim.__index = Optim

local schedule_kinds = { constant = C.LUTRA_LR_CONSTANT, cosine = C.LUTRA_LR_WARMUP_COSINE,
                         linear = C.LUTRA_LR_WARMUP_LINEAR }
local decay_rules = { all = C.LUTRA_DECAY_ALL, matrices = C.LUTRA_DECAY_MATRICES }
local schedule_keys = { kind = true, warmup = true, total = true, min_lr = true }

-- an integral number for an int64 field (its range is the C side's to check)
local function steps(v, name, where)
  if type(v) ~= "number" or v ~= v or v ~= math.floor(v) or math.abs(v) >= 2 ^ 53 then
    error(string.format("%s: %s must be an integer (got %s)", where, name, chk.got(v)), 5)
  end
  return v
end

-- the lutra_lr_schedule s from a table {kind =, warmup =, total =, min_lr =}
local function fill_schedule(s, t, where)
  if type(t) ~= "table" then
    error(string.format("%s: schedule must be a table (got %s)", where, chk.got(t)), 4)
  end
  for k in pairs(t) do
    if not schedule_keys[k] then
      error(string.format("%s: unknown schedule option '%s'", where, tostring(k)), 4)
    end
  end
  s.kind = core.code(schedule_kinds, t.kind or "cosine", "schedule kind", where)
  s.warmup_steps = steps(t.warmup or 0, "schedule.warmup", where)
  if t.total == nil and s.kind ~= C.LUTRA_LR_CONSTANT then
    error(string.format("%s: schedule.total (the step the lr reaches min_lr) is needed for a %s "
                        .. "schedule", where, t.kind or "cosine"), 4)
  end
  s.total_steps = steps(t.total or 0, "schedule.total", where)
  s.min_lr = chk.number(t.min_lr or 0, "schedule.min_lr", where, 5)
end

local function new(kind, module, opts, allowed, decay, where)
  opts = core.check_options(opts, allowed, where)
  -- a module written in Lua: its children's C Sequential (lutra.lua_module)
  if type(module) == "table" and type(module.checkpoint_module) == "function" then
    module = module:checkpoint_module()
  end
  if module ~= nil and not chk.is_module(module) then
    error(string.format("%s: module must be a module (got %s)", where, chk.got(module)), 3)
  end
  local d = ffi.new("lutra_optim_desc")
  C.lutra_optim_defaults(kind, d)
  d.decay = core.code(decay_rules, opts.decay or decay, "decay rule", where)
  if opts.schedule ~= nil then fill_schedule(d.schedule, opts.schedule, where) end
  -- numbers only (the C side checks their ranges); "x" would be a raw FFI conversion error
  for k, v in pairs(opts) do
    if k ~= "decay" and k ~= "schedule" then d[k] = chk.number(v, k, where, 4) end
  end
  local box = ffi.new("lutra_optim*[1]")
  check(C.lutra_optim_new(d, module, box))
  return ffi.gc(box[0], C.lutra_optim_unref)
end

--- SGD over every parameter of module (and its children).
--
-- @param module a module; for several modules, pass a Sequential of them (see the lutra module)
--
-- @tparam[opt] table opts {lr =, momentum =, weight_decay =, max_grad_norm =, schedule =,
-- decay =}, as AdamW's; decay defaults to "all" here (torch's SGD: L2 on every parameter)
function M.SGD(module, opts)
  return new(C.LUTRA_OPTIM_SGD, module, opts,
             { lr = true, momentum = true, weight_decay = true, max_grad_norm = true,
               schedule = true, decay = true }, "all", "lutra.optim.SGD")
end

--- AdamW (decoupled weight decay) over every parameter of module and its children; bf16
-- parameters get f32 master copies.
--
-- @param module a module; for several modules, pass a Sequential of them (see the lutra module)
--
-- @tparam[opt] table opts
-- {lr =, weight_decay =, beta1 =, beta2 =, eps =, max_grad_norm =, schedule =, decay =}:
--
-- - lr: the base (peak) learning rate (default 1e-3);
-- - schedule: {kind = "cosine" | "linear" | "constant", warmup =, total =, min_lr =}: the lr of
--   step t (1-based; s = t - 1) is lr * (s + 1) / warmup while s < warmup, then decays from lr
--   at s = warmup to min_lr at s = total (cosine: min_lr + 0.5 (lr - min_lr) (1 + cos(pi (s -
--   warmup) / (total - warmup))); linear: a straight line) and stays at min_lr; "constant"
--   stays at lr after the warmup. Computed in double, rounded to f32 (lutra/train.h). Default:
--   no schedule (lr at every step); kind defaults to "cosine", warmup and min_lr to 0;
-- - max_grad_norm: clip the global gradient norm as torch.nn.utils.clip_grad_norm_ (0: off,
--   the default; math.huge: measure the norm for opt:grad_norm() without clipping);
-- - decay: which parameters take weight decay: "matrices" (the default: parameters of 2 or
--   more dimensions, i.e. weights of Linear, grouped and embedding modules; biases and norm
--   weights take none, as nanoGPT does) or "all".
function M.AdamW(module, opts)
  return new(C.LUTRA_OPTIM_ADAMW, module, opts,
             { lr = true, weight_decay = true, beta1 = true, beta2 = true, eps = true,
               max_grad_norm = true, schedule = true, decay = true },
             "matrices", "lutra.optim.AdamW")
end

--- An optimizer (lutra.optim.SGD / AdamW).
-- @type Optim

-- optim:set_<name>(v): a number (its range is the C call's to check)
local function set_number(self, v, name, setter)
  chk.number(v, name, "optim:set_" .. name, 4)
  check(setter(self, v))
end

--- One update of every parameter from its gradient (one C call).
function Optim:step()
  if C.lutra_optim_step(self) ~= 0 then core.fail() end
end

--- Gradient accumulation: adds every parameter's gradient into an f32 sum (call it after each
-- micro-batch's backward); the next step takes the mean of the sums and starts a new window
-- (lutra_optim_accumulate; the first call allocates the sums: not inside a graph capture).
function Optim:accumulate()
  if C.lutra_optim_accumulate(self) ~= 0 then core.fail() end
end

local count_box = ffi.new("int32_t[1]")
--- The micro-batches summed since the last step.
-- @treturn integer
function Optim:accumulated()
  check(C.lutra_optim_accumulated(self, count_box))
  return tonumber(count_box[0])
end

--- Sets the base (peak) learning rate of the schedule for the next steps (a captured step keeps
-- the one it captured).
-- @tparam number lr
function Optim:set_lr(lr) set_number(self, lr, "lr", C.lutra_optim_set_lr) end

local schedule_box = ffi.new("lutra_lr_schedule")
--- Replaces the learning-rate schedule (a table as AdamW's schedule option).
-- @tparam table schedule
function Optim:set_schedule(schedule)
  fill_schedule(schedule_box, schedule, "optim:set_schedule")
  check(C.lutra_optim_set_schedule(self, schedule_box))
end

--- Sets the gradient-norm threshold (0: no clipping).
-- @tparam number max_grad_norm
function Optim:set_max_grad_norm(max_grad_norm)
  set_number(self, max_grad_norm, "max_grad_norm", C.lutra_optim_set_max_grad_norm)
end

local float_box = ffi.new("float[1]")
--- The learning rate the next step takes (the schedule at the steps run so far; on cuda a
-- synchronizing read of the device's step count).
-- @treturn number
function Optim:lr()
  check(C.lutra_optim_lr(self, float_box))
  return tonumber(float_box[0])
end

--- The global gradient norm (before clipping) of the last step that computed one
-- (max_grad_norm > 0), 0 before that; on cuda a synchronizing read.
-- @treturn number
function Optim:grad_norm()
  check(C.lutra_optim_grad_norm(self, float_box))
  return tonumber(float_box[0])
end

--- Frees the optimizer (its moments and masters) now.
function Optim:destroy() check(C.lutra_optim_destroy(self)) end

local steps_box = ffi.new("int64_t[2]")
--- The step calls made, and the steps run on the device (a captured step's replays count
-- there; on the cpu both are the same).
-- @treturn number host steps
-- @treturn number device steps
function Optim:steps()
  check(C.lutra_optim_steps(self, steps_box, steps_box + 1))
  return tonumber(steps_box[0]), tonumber(steps_box[1])
end

ffi.metatype("struct lutra_optim", { __index = Optim })

return M
