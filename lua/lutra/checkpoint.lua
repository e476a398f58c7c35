--- Checkpoints: safetensors files of a model's parameters and FP8 state, an optimizer's state and
-- the global generator (src/lutra/checkpoint.h lists the names and the guarantees).
--   lutra.save("run.safetensors", {model = net, optim = opt, rng = true})
--   lutra.load("run.safetensors", {model = net, optim = opt, rng = true, recipe = r})
-- objects (a table; at least one of model, optim, rng):
--   model       a module: its parameters ("0.weight", "2.bias", ...) and the state of every
--               quantizer it owns ("0.fp8.input.scale", ...); names per module kind in
--               src/lutra/checkpoint.h; an object with a checkpoint_module method (lutra.moe.Router)
--               stands for the module it returns
--   optim       an optimizer over model or a module inside it: moments, f32 masters, step count
--               (and the device's step)
--   rng         true: the global seed generator (lutra.manual_seed's state)
--   fp8         false: leave the quantizers' state out (default true)
--   main_grads  true: the f32 main grads too (default false)
--   recipe      load only: a model that ran no FP8 forward yet builds its quantizers for this
--               recipe first, so that the file's FP8 state has somewhere to go
-- lutra.load's third argument (optional):
--   map         {["name in the file"] = "lutra name" or false}: a file written elsewhere
--               (torch's state dict: {["fc1.weight"] = "0.weight"}); false skips the tensor
--   convert     true: a parameter stored as f32, bf16 or f16 is converted to the parameter's
--               dtype (widening exact, narrowing rounded to nearest even); else refused
-- A load checks the whole file against the objects first and changes nothing when it fails.
-- Under delayed scaling a save between the micro-batches of an accumulated step (after a
-- forward with is_first_microbatch true, before the optimizer step) is refused: the cached FP8
-- weight is not saved, so it could not resume exactly (src/lutra/checkpoint.h).
-- @module lutra.checkpoint
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local optim_t = ffi.typeof("lutra_optim *")

local object_keys = { model = true, optim = true, rng = true, fp8 = true, main_grads = true,
                      recipe = true }

local function objects_of(objects, where, for_load)
  if type(objects) ~= "table" then
    error(string.format("%s: objects must be a table like {model = m, optim = o, rng = true} "
                        .. "(got %s)", where, chk.got(objects)), 3)
  end
  core.check_options(objects, object_keys, where)
  local o = ffi.new("lutra_checkpoint_objects")
  C.lutra_checkpoint_defaults(o)
  local model = objects.model
  if type(model) == "table" and type(model.checkpoint_module) == "function" then
    model = model:checkpoint_module()
  end
  if model ~= nil and not chk.is_module(model) then
    error(string.format("%s: model must be a module or nil (got %s)", where, chk.got(objects.model)), 3)
  end
  chk.optional_object(objects.optim, optim_t, "an optimizer", "optim", where, 4)
  chk.optional_object(objects.recipe, chk.recipe_t, "a recipe", "recipe", where, 4)
  if objects.recipe ~= nil and not for_load then
    error(where .. ": recipe is for lutra.load (a saved model's quantizers exist already)", 3)
  end
  o.model, o.optim, o.recipe = model, objects.optim, objects.recipe
  for _, k in ipairs { "rng", "fp8", "main_grads" } do
    if objects[k] ~= nil then
      chk.boolean(objects[k], k, where, 4)
      o[k] = objects[k] and 1 or 0
    end
  end
  return o
end

--- lutra.save: writes the objects' state to a safetensors file.
-- @tparam string path the file (replaced when it exists)
-- @tparam table objects {model =, optim =, rng =, fp8 =, main_grads =} (see above)
function M.save(path, objects)
  local where = "lutra.save"
  chk.path(path, "path", where)
  local o = objects_of(objects, where, false)
  check(C.lutra_checkpoint_save(path, o))
  -- the objects stay referenced until the call returned
  return objects
end

local function options_of(opts, where)
  opts = core.check_options(opts, { map = true, convert = true }, where)
  if opts.map == nil and opts.convert == nil then return nil end
  local lo = ffi.new("lutra_checkpoint_load_opts")
  local keep = {}
  if opts.map ~= nil then
    if type(opts.map) ~= "table" then
      error(string.format("%s: map must be a table of file name -> name or false (got %s)", where,
                          chk.got(opts.map)), 3)
    end
    local names = {}
    for from, to in pairs(opts.map) do
      if type(from) ~= "string" or (type(to) ~= "string" and to ~= false) then
        error(string.format("%s: map entries must be string -> string or false (got %s -> %s)",
                            where, chk.got(from), chk.got(to)), 3)
      end
      names[#names + 1] = from
    end
    table.sort(names) -- a stable order: the first error named is the same every run
    local arr = ffi.new("lutra_checkpoint_rename[?]", math.max(#names, 1))
    for i, from in ipairs(names) do
      arr[i - 1].from = from
      arr[i - 1].to = opts.map[from] or nil
    end
    lo.map, lo.map_len = arr, #names
    keep.arr = arr
  end
  if opts.convert ~= nil then
    chk.boolean(opts.convert, "convert", where, 4)
    lo.convert = opts.convert and 1 or 0
  end
  return lo, keep
end

--- lutra.load: reads a safetensors file into the objects; a file that does not match them (a
-- missing or unknown name, a shape or dtype) is an error naming the tensor, and nothing
-- changes.
-- @tparam string path
-- @tparam table objects {model =, optim =, rng =, fp8 =, main_grads =, recipe =} (see above)
-- @tparam[opt] table opts {map =, convert =} (see above)
-- @return objects
function M.load(path, objects, opts)
  local where = "lutra.load"
  chk.path(path, "path", where)
  local o = objects_of(objects, where, true)
  -- lo points at the rename array (held by keep) and at opts' strings: both stay referenced
  -- from this frame during the call, which runs no Lua code (so no collection)
  local lo, keep = options_of(opts, where)
  local st = C.lutra_checkpoint_load(path, o, lo)
  if st ~= 0 then core.fail() end
  return objects
end

return M
