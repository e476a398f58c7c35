--- Modules written in Lua, composed from lutra's modules and tensor operations, that take part
-- in nn.Sequential, backward, optimizers, checkpoints, print and CUDA graphs like the C ones.
--   local Block = nn.Module("ResidualMLP")
--   function Block:init(d, h)          -- Block(d, h) makes one; children are registered by add
--     self.f = self:add(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(),
--                                     nn.Linear(h, d)))
--   end
--   function Block:forward(x, opts)    -- y = x + f(x), into a buffer the block reuses
--     return lutra.add(x, self.f:forward(x, opts), self:buffer("y", x))
--   end
--   function Block:backward(dy, input_grad)
--     local df = self.f:backward(dy, input_grad)
--     if input_grad == false then return nil end
--     return lutra.add(dy, df, self:buffer("dx", dy))   -- dx = dy + f'(dy)
--   end
--   local net = nn.Sequential(nn.Linear(16, 64), Block(64, 256), nn.Linear(64, 10))
--
-- The protocol. A Lua module is a table with forward(self, x, opts, ...) returning its output
-- and backward(self, dy, input_grad) returning its input's gradient (nil when input_grad is
-- false: the input is data), and optionally children(self), an array of the lutra modules (C or
-- Lua) whose parameters it trains. It holds no parameters of its own: its trainable state lives in
-- those children, which is how optimizers, zero_grad, parameters() and checkpoints reach it
-- (through one C Sequential of the children, made once: its "container"). nn.Module(name) makes
-- a class that implements children through self:add and gives every instance the methods of a
-- module (parameters, zero_grad, kind, buffer, print).
--
-- nn.Sequential of C modules only stays the C Sequential. With a Lua module in it, it is a
-- Sequential in Lua: forward runs the elements in order and backward in reverse, each run of
-- consecutive C modules as one C Sequential (their fusions apply inside it); opts
-- (is_first_microbatch or {is_first_microbatch =, grad =}, a GroupedLinear's m_splits) reach every
-- element. Its checkpoint names are those the C Sequential of the same modules would have
-- ("0.weight", "2.bias"; a Lua element's children below its index: "1.0.weight").
-- @module lutra.lua_module
local core = require("lutra.core")
local chk = require("lutra.check")
local tensor = require("lutra.tensor")
local tree = require("lutra.module_tree")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}

--- Whether v is a Lua module (a table with forward and backward functions).
-- @param v anything
-- @treturn boolean
function M.is_lua_module(v)
  return type(v) == "table" and type(v.forward) == "function" and type(v.backward) == "function"
end

-- the children of a Lua module, checked: an array of modules
local function children_of(m, where)
  if m.children == nil then return {} end
  if type(m.children) ~= "function" then
    error(string.format("%s: children must be a method returning an array of modules (got %s)",
                        where, chk.got(m.children)), 0)
  end
  local kids = m:children()
  if type(kids) ~= "table" then
    error(string.format("%s: children() must return an array of modules (got %s)", where,
                        chk.got(kids)), 0)
  end
  for i, c in ipairs(kids) do
    if not chk.is_module(c) and not M.is_lua_module(c) then
      error(string.format("%s: child %d is not a module (got %s)", where, i, chk.got(c)), 0)
    end
  end
  return kids
end

--- Refuses v unless it follows the protocol, naming what is missing.
-- @local nn.Sequential checks its arguments with it
-- @param v the object
-- @tparam string what how the message names it ("argument 2")
-- @tparam string where the call
function M.check(v, what, where)
  if type(v) ~= "table" then
    error(string.format("%s: %s must be a module (got %s)", where, what, chk.got(v)), 0)
  end
  for _, name in ipairs { "forward", "backward" } do
    if type(v[name]) ~= "function" then
      error(string.format("%s: %s must be a module: a table without a %s method (a Lua module "
                          .. "has forward(self, x, opts) and backward(self, dy, input_grad); "
                          .. "lutra.nn.Module(name) makes a class of them)", where, what, name), 0)
    end
  end
  children_of(v, where .. ": " .. what)
end

-- Lua module -> its container (weak keys: it lives while the module does)
local containers = setmetatable({}, { __mode = "k" })
local module_box = ffi.new("lutra_module*[1]")
local module_ptr = ffi.typeof("lutra_module *")

--- The C Sequential of a Lua module's children (a Lua child stands as its own container, one
-- without children as a parameterless placeholder, so that names keep their positions), made
-- once; nil when the module has no children.
-- @param m a Lua module
-- @return a C module or nil
function M.container(m)
  local c = containers[m]
  if c ~= nil then return c or nil end
  local kids = children_of(m, "lutra.nn.Module")
  if #kids == 0 then
    containers[m] = false
    return nil
  end
  local arr = ffi.new("lutra_module*[?]", #kids)
  local keep = {} -- the placeholders' handles, alive until the Sequential holds them
  for i, k in ipairs(kids) do
    if M.is_lua_module(k) then
      k = M.container(k)
      if k == nil then
        check(C.lutra_activation_new(C.LUTRA_ACTIVATION_RELU, module_box))
        k = ffi.gc(module_box[0], C.lutra_module_unref)
      end
    end
    keep[i] = k
    arr[i - 1] = k
  end
  check(C.lutra_sequential_new(arr, #kids, module_box))
  c = tree.own_ref(module_box[0])
  containers[m] = c
  return c
end

-- ---- the methods of every Lua module (nn.Module's classes inherit them) ----
local Base = {}

--- The methods of a module written in Lua (nn.Module's classes, and nn.Sequential holding one).
-- @type LuaModule

--- Registers a child module (C or Lua) whose parameters this module trains; call it in init.
-- @param m the child
-- @return m
function Base:add(m)
  local where = "lutra.nn.Module:add"
  if not chk.is_module(m) then M.check(m, "the child", where) end
  if containers[self] ~= nil then
    error(where .. ": children are fixed once the module was used (register them in init)", 2)
  end
  local kids = rawget(self, "_children")
  kids[#kids + 1] = m
  return m
end

--- The children registered by add.
-- @treturn table an array of modules
function Base:children() return rawget(self, "_children") end

--- The parameters of the children, in order (as a C module's parameters()).
-- @treturn table {{value =, grad =, main_grad =}, ...}
function Base:parameters()
  local c = M.container(self)
  return c and c:parameters() or {}
end

--- Zeroes the children's gradients.
function Base:zero_grad()
  local c = M.container(self)
  if c then c:zero_grad() end
end

--- The C module that stands for this one in optimizers and checkpoints (lutra.save's model
-- may be a Lua module through it); nil without children.
-- @return a C Sequential or nil
function Base:checkpoint_module() return M.container(self) end

--- The module's kind: the name given to nn.Module.
-- @treturn string
function Base:kind() return self.__kind end

--- A tensor of like's shape, dtype and device kept in the module under key and reused while
-- like's shape stays the same (for the module's outputs and gradients: no allocation per step).
-- @tparam string key
-- @param like a tensor
-- @return the buffer
function Base:buffer(key, like)
  local b = rawget(self, key)
  if b ~= nil and b.ndim == like.ndim and b.dtype == like.dtype and b.device == like.device
     and not b:is_freed() then
    -- no loop over the dims: a small inner loop would be traced apart from a training loop's
    local s, l, n = b.shape, like.shape, like.ndim
    if s[0] == l[0] and (n < 2 or s[1] == l[1]) and (n < 3 or s[2] == l[2])
       and (n < 4 or s[3] == l[3]) then
      return b
    end
  end
  b = tensor.new(like:dims(), like:dtype_name(), like:device_name())
  rawset(self, key, b)
  return b
end

--- @section end

--- nn.Module(name): a class of modules written in Lua (see above). Cls(...) makes an instance
-- and calls Cls.init(self, ...); the class must define forward and backward.
-- @tparam string name the kind, shown by print
-- @treturn table the class
function M.class(name)
  if type(name) ~= "string" then
    error(string.format("lutra.nn.Module: name must be a string (got %s)", chk.got(name)), 2)
  end
  local cls = { __kind = name }
  cls.__index = cls
  cls.__tostring = tree.tostring
  return setmetatable(cls, { __index = Base, __call = function(c, ...)
    local self = setmetatable({ _children = {} }, c)
    if c.init then c.init(self, ...) end
    M.check(self, "a " .. name, "lutra.nn.Module(" .. name .. ")")
    return self
  end })
end

-- ---- the Sequential in Lua ----
local LuaSequential = M.class("Sequential")
LuaSequential.__display = "lutra.nn.Sequential"

--- Forward of each element in order (see above).
-- @param x the input
-- @param[opt] opts as a C module's forward
-- @param[opt] extra a GroupedLinear's options after m_splits
-- @return the output
function LuaSequential:forward(x, opts, extra) return self._forward(x, opts, extra) end

--- Backward of each element in reverse.
-- @param dy the output's gradient
-- @param[opt] input_grad false: no gradient for the input (returns nil)
-- @return the input's gradient
function LuaSequential:backward(dy, input_grad) return self._backward(dy, input_grad) end

--- The elements, as given.
-- @treturn table
function LuaSequential:children() return self._elements end

--- The fusions of the last forward and backward in its C runs (C Sequential's fusions).
-- @return forward, backward: counts
function LuaSequential:fusions()
  local f, b = 0, 0
  for _, s in ipairs(self._runs) do
    local sf, sb = s:fusions()
    f, b = f + sf, b + sb
  end
  return f, b
end

-- The steps' forwards in order and backwards in reverse as straight-line code, generated once per
-- step count: a loop over the steps (calls of several kinds at one call site) is a small inner
-- loop that LuaJIT traces on its own, which keeps a training loop around it from compiling into
-- one trace.
local chain_makers = {}
local function chain(steps)
  local n = #steps
  local make = chain_makers[n]
  if make == nil then
    local names, fwd, bwd = {}, {}, {}
    for i = 1, n do
      names[i] = "s" .. i
      fwd[i] = string.format("x = s%d:forward(x, o, e)", i)
    end
    for i = n, 2, -1 do bwd[#bwd + 1] = string.format("d = s%d:backward(d)", i) end
    make = assert(loadstring(string.format(
      "local %s = ...\nreturn function(x, o, e) %s return x end, function(d, g) %s "
      .. "return s1:backward(d, g) end", table.concat(names, ", "), table.concat(fwd, " "),
      table.concat(bwd, " ")), "=lutra.nn.Sequential (Lua)"))
    chain_makers[n] = make
  end
  return make(unpack(steps, 1, n))
end

-- every module reachable through Lua (elements, Lua children), C Sequentials not opened: a
-- module listed twice would keep only one of its two forwards' states for backward
local function refuse_repeats(list, seen, where)
  for _, m in ipairs(list) do
    local key = chk.is_module(m) and tonumber(ffi.cast("uintptr_t", ffi.cast(module_ptr, m))) or m
    if seen[key] then
      error(string.format("%s: a module appears twice (%s): a module keeps the state of its last "
                          .. "forward for backward, so it can appear only once", where,
                          tostring(m)), 0)
    end
    seen[key] = true
    if not chk.is_module(m) then refuse_repeats(children_of(m, where), seen, where) end
  end
end

--- The Sequential that nn.Sequential makes when a Lua module is among its arguments.
-- @local called by lutra.nn's Sequential
-- @tparam table mods the arguments (n of them, modules C or Lua)
-- @tparam integer n
-- @tparam function c_sequential makes a C Sequential of an array of C modules
function M.Sequential(mods, n, c_sequential)
  local where = "lutra.nn.Sequential"
  local self = setmetatable({ _children = {} }, LuaSequential)
  local elements, steps, runs, run = {}, {}, {}, {}
  local function flush()
    if #run == 1 then steps[#steps + 1] = run[1] end
    if #run > 1 then
      local s = c_sequential(run, #run)
      steps[#steps + 1] = s
      runs[#runs + 1] = s
    end
    run = {}
  end
  for i = 1, n do
    local m = mods[i]
    if chk.is_module(m) then
      run[#run + 1] = m
    else
      M.check(m, "argument " .. i, where)
      flush()
      steps[#steps + 1] = m
    end
    elements[i] = m
    self[i] = m -- seq[i] and #seq
  end
  flush()
  refuse_repeats(elements, {}, where)
  if #steps > 150 then -- more than Lua's locals: split it into Sequentials of Sequentials
    error(string.format("%s: %d steps; at most 150 (nest Sequentials)", where, #steps), 0)
  end
  self._elements, self._runs = elements, runs
  self._forward, self._backward = chain(steps)
  return self
end

return M
