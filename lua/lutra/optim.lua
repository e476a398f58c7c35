--- Optimizers in C over all parameters of a module in one call per step.
--   local opt = lutra.optim.AdamW(net, {lr=1e-3, weight_decay=0.01})
--   opt:step()
-- @module lutra.optim
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Optim = {}
Optim.__index = Optim

local function new(kind, module, opts, allowed, where)
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
  -- numbers only (the C side checks their ranges); "x" would be a raw FFI conversion error
  for k, v in pairs(opts) do d[k] = chk.number(v, k, where, 4) end
  local box = ffi.new("lutra_optim*[1]")
  check(C.lutra_optim_new(d, module, box))
  return ffi.gc(box[0], C.lutra_optim_unref)
end

--- SGD over every parameter of module (and its children).
--
-- @param module a module; for several modules, pass a Sequential of them (see the lutra module)
--
-- @tparam[opt] table opts {lr =, momentum =, weight_decay =}
function M.SGD(module, opts)
  return new(C.LUTRA_OPTIM_SGD, module, opts,
             { lr = true, momentum = true, weight_decay = true }, "lutra.optim.SGD")
end

--- AdamW (decoupled weight decay) over every parameter of module and its children; bf16
-- parameters get f32 master copies.
--
-- @param module a module; for several modules, pass a Sequential of them (see the lutra module)
--
-- @tparam[opt] table opts {lr =, weight_decay =, beta1 =, beta2 =, eps =}
function M.AdamW(module, opts)
  return new(C.LUTRA_OPTIM_ADAMW, module, opts,
             { lr = true, weight_decay = true, beta1 = true, beta2 = true, eps = true },
             "lutra.optim.AdamW")
end

--- An optimizer (lutra.optim.SGD / AdamW).
-- @type Optim

--- One update of every parameter from its gradient (one C call).
function Optim:step()
  if C.lutra_optim_step(self) ~= 0 then core.fail() end
end

--- Sets the learning rate for the next steps.
-- @tparam number lr
function Optim:set_lr(lr)
  chk.number(lr, "lr", "optim:set_lr")
  check(C.lutra_optim_set_lr(self, lr))
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
