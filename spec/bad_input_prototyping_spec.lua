-- Bad inputs for the recipe-prototyping API (Lua rules, factory recipes, recipe options, module
-- names), through Lua and through the C API directly: each refused with "call: reason", and the
-- objects involved still working afterwards.
local lutra = require("lutra")
local ffi, C = lutra.ffi, lutra.C
local E = require("spec.support.errors")
local R = lutra.recipe
local nn = lutra.nn

local counter = { n = 0 }
local c_check = E.c_check
local function cases(list) E.cases(list, counter, it) end

local base = R.delayed()

describe("bad inputs: recipe prototyping", function()
  cases {
    { "scaling rule not a function", function() R.delayed { scaling_factor_compute_algo = {} } end,
      "lutra.recipe.delayed", "scaling_factor_compute_algo must be a function (got table" },
    { "amax rule neither a name nor a function", function() R.delayed { amax_compute_algo = 3.5 } end,
      "lutra.recipe.delayed", "amax_compute_algo code must be an integer" },
    { "factory not a function", function() R.custom { factory = "f" } end, "lutra.recipe.custom",
      "factory must be a function" },
    { "factory with per-role tables", function() R.custom { factory = function() end, weight = {} } end,
      "lutra.recipe.custom", "unknown option 'weight'" },
    { "gemm option for an unknown GEMM", function() R.current { gemm = { bgrad = {} } } end,
      "lutra.recipe.current", "unknown GEMM 'bgrad'" },
    { "use_split_accumulator not a boolean",
      function() R.current { gemm = { wgrad = { use_split_accumulator = "yes" } } } end,
      "lutra.recipe.current", "gemm.wgrad.use_split_accumulator must be a boolean" },
    { "backward_override unknown", function() R.mxfp8 { backward_override = "fp4" } end,
      "lutra.recipe.mxfp8", "unknown backward_override 'fp4'" },
    { "name not a string", function() nn.Linear(16, 16, { name = 1 }) end, "lutra.nn.Linear",
      "name must be a string" },
    { "name too long", function() nn.Linear(16, 16, { name = string.rep("x", 64) }) end,
      "lutra_module_set_name", "name is longer than 63 bytes" },
    { "C: negative rule id", function()
      local d = ffi.new("lutra_delayed_desc")
      C.lutra_delayed_defaults(d)
      d.rule = -1
      c_check(C.lutra_recipe_delayed(d, ffi.new("lutra_recipe*[1]")))
    end, "lutra_recipe_delayed", "rule must be >= 0" },
    { "C: factory id 0", function()
      local d = ffi.new("lutra_factory_desc")
      C.lutra_factory_defaults(d)
      c_check(C.lutra_recipe_factory(d, ffi.new("lutra_recipe*[1]")))
    end, "lutra_recipe_factory", "factory must be > 0" },
    { "C: options with a split flag of 2", function()
      local o = ffi.new("lutra_recipe_options")
      C.lutra_recipe_options_defaults(o)
      o.use_split_accumulator[1] = 2
      c_check(C.lutra_recipe_with_options(base, o, ffi.new("lutra_recipe*[1]")))
    end, "lutra_recipe_with_options", "use_split_accumulator for dgrad must be 0 or 1" },
    { "C: options NULL", function()
      c_check(C.lutra_recipe_with_options(base, nil, ffi.new("lutra_recipe*[1]")))
    end, "lutra_recipe_with_options", "options are NULL" },
    { "C: rules_take NULL outputs", function() c_check(C.lutra_rules_take(nil, nil)) end,
      "lutra_rules_take", "output pointers must not be NULL" },
    { "C: factory_request with nothing waiting", function()
      c_check(C.lutra_factory_request(ffi.new("int[1]"), ffi.new("const char*[1]"),
                                      ffi.new("const char*[1]")))
    end, "lutra_factory_request", "no module waits for a choice" },
    { "C: factory_resolve with nothing waiting", function()
      c_check(C.lutra_factory_resolve(ffi.new("lutra_factory_choice[3]")))
    end, "lutra_factory_resolve", "no module waits for a choice" },
    { "C: set_name on a GELU", function()
      c_check(C.lutra_module_set_name(nn.GELU(), "g"))
    end, "lutra_module_set_name", "a gelu takes no name" },
    { "C: history_len of a current quantizer", function()
      c_check(C.lutra_quantizer_history_len(lutra.quantizer(R.current(), "input"), ffi.new("int[1]")))
    end, "lutra_quantizer_history_len", "quantizer does not use delayed scaling" },
  }

  it("leave the recipe and a module working", function()
    assert.are.equal("delayed", base:kind())
    local lin = nn.Linear(16, 16, { seed = 1 })
    local x = lutra.tensor({ 16, 16 }):randn(2)
    local a = lutra.autocast { recipe = base }:run(function() return lin:forward(x):to_table() end)
    assert.are.equal(256, #a)
    assert.are.equal(0, C.lutra_rules_pending())
    assert.are.equal(18, counter.n)
    io.stderr:write("bad inputs in this file: ", counter.n, "\n")
  end)
end)
