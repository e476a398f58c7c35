-- Bad inputs: each must raise a Lua error whose message is "call: reason" (after Lua's
-- "file:line: " position, which names the caller's line), and must leave every object as it
-- was. State is checked by running good calls after the error and comparing them with a
-- fresh module built from the same seed (or by reading values before and after).
local lutra = require("lutra")
local E = require("spec.support.errors")
local message_of, expect_error = E.message_of, E.expect_error

local function same(a, b, what)
  assert.are.equal(#a, #b, what .. ": element count")
  for i = 1, #a do
    if a[i] ~= b[i] then
      assert.is_true(false, string.format("%s: element %d is %.9g, expected %.9g", what, i,
                                          a[i], b[i]))
    end
  end
end

local function all_zero(t, what)
  for i, v in ipairs(t) do
    if v ~= 0 then assert.is_true(false, string.format("%s: element %d is %g", what, i, v)) end
  end
end

-- Runs forward(x) and backward(dy) on m and on a fresh Linear(in, out, opts); both must agree
-- bit for bit (y, dx and every parameter gradient).
local function assert_like_fresh(m, in_f, out_f, opts, x, dy, what, scope_recipe)
  local fresh = lutra.nn.Linear(in_f, out_f, opts)
  local function run(mod, scope)
    if scope then scope:enter() end
    local y = mod:forward(x):to_table()
    local dx = mod:backward(dy):to_table()
    if scope then scope:exit() end
    local g = {}
    for i, p in ipairs(mod:parameters()) do g[i] = p.grad:to_table() end
    return y, dx, g
  end
  local y1, dx1, g1 = run(m, scope_recipe and lutra.autocast{ recipe = scope_recipe() })
  local y2, dx2, g2 = run(fresh, scope_recipe and lutra.autocast{ recipe = scope_recipe() })
  same(y1, y2, what .. ": y")
  same(dx1, dx2, what .. ": dx")
  assert.are.equal(#g2, #g1)
  for i = 1, #g1 do same(g1[i], g2[i], what .. ": grad " .. i) end
end

describe("errors", function()
  describe("nn.Linear", function()
    local IN, OUT, N = 32, 16, 8
    local opts = { seed = 77 }

    it("wrong number of input features names both counts; the last forward is kept", function()
      local m = lutra.nn.Linear(IN, OUT, opts)
      local x = lutra.tensor({ N, IN }):randn(4001)
      local dy = lutra.tensor({ N, OUT }):randn(4002)
      local y = m:forward(x)
      local y_before = y:to_table()
      expect_error(function() m:forward(lutra.tensor({ N, 30 }):randn(4003)) end,
                   "lutra_linear_forward", "input has 30 features, the module expects 32")
      expect_error(function() m:forward(lutra.tensor({ 2, 4, 33 })) end,
                   "lutra_linear_forward", "input has 33 features, the module expects 32")
      same(y:to_table(), y_before, "output buffer after a refused forward")
      -- backward still pairs with the last good forward
      local dx = m:backward(dy):to_table()
      local fresh = lutra.nn.Linear(IN, OUT, opts)
      fresh:forward(x)
      same(dx, fresh:backward(dy):to_table(), "dx after a refused forward")
      same(m:parameters()[1].grad:to_table(), fresh:parameters()[1].grad:to_table(), "dW")
      same(m:parameters()[2].grad:to_table(), fresh:parameters()[2].grad:to_table(), "db")
    end)

    it("wrong dtypes: bf16 and i32 inputs to an f32 Linear, f32 grad_output to a bf16 one",
       function()
      local m = lutra.nn.Linear(IN, OUT, opts)
      expect_error(function() m:forward(lutra.tensor({ N, IN }, "bf16"):randn(4011)) end,
                   "lutra_linear_forward", "input dtype bf16 does not match the module's f32")
      expect_error(function() m:forward(lutra.tensor({ N, IN }, "i32")) end,
                   "lutra_linear_forward", "input dtype i32 does not match the module's f32")
      assert_like_fresh(m, IN, OUT, opts, lutra.tensor({ N, IN }):randn(4012),
                        lutra.tensor({ N, OUT }):randn(4013), "f32 module after dtype errors")

      local bopts = { seed = 78, dtype = "bf16" }
      local mb = lutra.nn.Linear(IN, OUT, bopts)
      local xb = lutra.tensor({ N, IN }, "bf16"):randn(4014)
      local dyb = lutra.tensor({ N, OUT }, "bf16"):randn(4015)
      expect_error(function() mb:forward(lutra.tensor({ N, IN }):randn(4016)) end,
                   "lutra_linear_forward", "input dtype f32 does not match the module's bf16")
      mb:forward(xb)
      expect_error(function() mb:backward(lutra.tensor({ N, OUT }):randn(4017)) end,
                   "lutra_linear_backward",
                   "grad_output dtype f32 does not match the module's bf16")
      all_zero(mb:parameters()[1].grad:to_table(), "bf16 dW after a refused backward")
      assert_like_fresh(mb, IN, OUT, bopts, xb, dyb, "bf16 module after dtype errors")
    end)

    it("grad_output of the wrong shape is refused and the grads stay", function()
      local m = lutra.nn.Linear(IN, OUT, opts)
      local x = lutra.tensor({ N, IN }):randn(4021)
      local dy = lutra.tensor({ N, OUT }):randn(4022)
      m:forward(x)
      local dx = m:backward(dy)
      local dx_before = dx:to_table()
      local p = m:parameters()
      local gw, gb = p[1].grad:to_table(), p[2].grad:to_table()
      for _, shape in ipairs({ { N, OUT - 1 }, { OUT, N }, { N + 1, OUT }, { 2, N / 2, OUT } }) do
        expect_error(function() m:backward(lutra.tensor(shape):randn(4023)) end,
                     "lutra_linear_backward", "grad_output shape does not match the forward output")
      end
      same(dx:to_table(), dx_before, "dx buffer after refused backwards")
      same(p[1].grad:to_table(), gw, "dW after refused backwards")
      same(p[2].grad:to_table(), gb, "db after refused backwards")
      same(m:backward(dy):to_table(), dx_before, "dx of a good backward after the errors")
    end)

    it("backward before forward is refused (Linear, GELU, Sequential, losses)", function()
      local m = lutra.nn.Linear(IN, OUT, opts)
      local dy = lutra.tensor({ N, OUT }):randn(4031)
      expect_error(function() m:backward(dy) end, "lutra_linear_backward",
                   "backward called before forward")
      all_zero(m:parameters()[1].grad:to_table(), "dW after a refused backward")
      all_zero(m:parameters()[2].grad:to_table(), "db after a refused backward")
      assert_like_fresh(m, IN, OUT, opts, lutra.tensor({ N, IN }):randn(4032), dy,
                        "Linear after a refused backward")

      expect_error(function() lutra.nn.GELU():backward(dy) end, "lutra_gelu_backward",
                   "backward called before forward")
      local seq = lutra.nn.Sequential(lutra.nn.Linear(IN, OUT, opts), lutra.nn.GELU())
      -- a Sequential runs its children backward from the last: the GELU refuses first
      expect_error(function() seq:backward(dy) end, "lutra_gelu_backward",
                   "backward called before forward")
      local loss = lutra.nn.MSELoss()
      expect_error(function() loss:backward() end, "lutra_loss_backward",
                   "backward called before forward")
      expect_error(function() loss:value() end, "lutra_loss_value", "no loss computed yet")
    end)

    it("FP8 forward with dims that are not multiples of 16 (32 for mxfp8); the module still works",
       function()
      local cases = {
        { make = function() return lutra.recipe.current{} end, bad = { 30, 32 }, good = { 32, 32 },
          reason = "FP8 needs both matrix dims to be multiples of 16 (got 30x32)" },
        { make = function() return lutra.recipe.delayed{ amax_history_len = 4 } end,
          bad = { 2, 7, 32 }, good = { 2, 8, 32 },
          reason = "multiples of 16 (got 14x32)" },
        { make = function() return lutra.recipe.mxfp8{} end, bad = { 48, 64 }, good = { 64, 64 },
          reason = "multiples of 32 (got 48x64)" },
      }
      for i, c in ipairs(cases) do
        local in_f = c.good[#c.good]
        local mopts = { seed = 80 + i }
        local m = lutra.nn.Linear(in_f, 32, mopts)
        local s = lutra.autocast{ recipe = c.make() }
        local bad = lutra.tensor(c.bad):randn(4040 + i)
        expect_error(function() s:run(function() m:forward(bad) end) end,
                     "lutra_linear_forward", c.reason)
        assert.are.equal(0, (lutra.autocast_state()))
        -- nothing ran: there is no forward to take a backward from
        local ydims = {}
        for k = 1, #c.good - 1 do ydims[k] = c.good[k] end
        ydims[#c.good] = 32
        expect_error(function() m:backward(lutra.tensor(ydims)) end, "lutra_linear_backward",
                     "backward called before forward")
        assert_like_fresh(m, in_f, 32, mopts, lutra.tensor(c.good):randn(4050 + i),
                          lutra.tensor(ydims):randn(4060 + i), "FP8 after a refused forward",
                          c.make)
      end
    end)

    it("an i32 tensor is refused as input and as grad_output", function()
      local m = lutra.nn.Linear(IN, OUT, opts)
      expect_error(function() m:forward(lutra.tensor({ N, IN }, "i32")) end,
                   "lutra_linear_forward", "input dtype i32")
      m:forward(lutra.tensor({ N, IN }):randn(4071))
      expect_error(function() m:backward(lutra.tensor({ N, OUT }, "i32")) end,
                   "lutra_linear_backward", "grad_output dtype i32")
    end)
  end)

  describe("nil arguments", function()
    it("are reported as '<name> is NULL' by the call that got them", function()
      local m = lutra.nn.Linear(4, 3, { seed = 1 })
      local t = lutra.tensor({ 2, 4 }):randn(4101)
      expect_error(function() m:forward(nil) end, "lutra_module_forward", "input is NULL")
      expect_error(function() m:backward(nil) end, "lutra_module_backward", "grad_output is NULL")
      local mse = lutra.nn.MSELoss()
      expect_error(function() mse:forward(nil, t) end, "lutra_loss_forward", "pred is NULL")
      expect_error(function() mse:forward(t, nil) end, "lutra_loss_forward", "target is NULL")
      local a, b, d = lutra.tensor({ 3, 4 }), lutra.tensor({ 2, 4 }), lutra.tensor({ 2, 3 })
      expect_error(function() lutra.gemm(nil, true, b, false, d) end, "lutra_gemm", "A is NULL")
      expect_error(function() lutra.gemm(a, true, nil, false, d) end, "lutra_gemm", "B is NULL")
      expect_error(function() lutra.gemm(a, true, b, false, nil) end, "lutra_gemm", "D is NULL")
      expect_error(function() lutra.optim.SGD(nil, { lr = 0.1 }) end, "lutra_optim_new",
                   "module is NULL")
      expect_error(function() lutra.optim.AdamW(nil) end, "lutra_optim_new", "module is NULL")
      local q = lutra.quantizer(lutra.recipe.current{}, "input")
      expect_error(function() q:quantize(nil) end, "lutra_quantize", "x is NULL")
      expect_error(function() lutra.dequantize(nil, t) end, "lutra_dequantize", "q is NULL")
      expect_error(function() lutra.nn.Sequential(m, nil) end, "lutra_sequential_new",
                   "module 2 is NULL")
      expect_error(function() t:copy(nil) end, "lutra_tensor_copy", "src is NULL")
      -- nothing was touched: the module still computes what a fresh one does
      local fresh = lutra.nn.Linear(4, 3, { seed = 1 })
      same(m:forward(t):to_table(), fresh:forward(t):to_table(), "forward after nil errors")
    end)
  end)

  describe("freed objects", function()
    it("a freed tensor reports 'was freed' wherever it is used", function()
      local m = lutra.nn.Linear(4, 3, { seed = 2 })
      local t = lutra.tensor({ 2, 4 }):randn(4201)
      t:destroy()
      assert.is_true(t:is_freed())
      assert.are.equal("lutra.tensor(freed)", tostring(t))
      expect_error(function() m:forward(t) end, "lutra_module_forward", "input was freed")
      expect_error(function() t:read() end, "lutra_tensor_get_f32", "tensor was freed")
      expect_error(function() t:item() end, "lutra_tensor_get_f32", "tensor was freed")
      expect_error(function() t:fill(1) end, "lutra_tensor_fill", "tensor was freed")
      expect_error(function() t:randn(1) end, "lutra_tensor_randn", "tensor was freed")
      expect_error(function() t:destroy() end, "lutra_tensor_destroy", "tensor was freed")
      local x = lutra.tensor({ 2, 4 }):randn(4202)
      m:forward(x)
      local dy = lutra.tensor({ 2, 3 }):randn(4203)
      dy:destroy()
      expect_error(function() m:backward(dy) end, "lutra_module_backward", "grad_output was freed")
      expect_error(function() lutra.nn.MSELoss():forward(t, x) end, "lutra_loss_forward",
                   "pred was freed")
      -- the module is unaffected
      local fresh = lutra.nn.Linear(4, 3, { seed = 2 })
      same(m:forward(x):to_table(), fresh:forward(x):to_table(),
           "forward after freed-tensor errors")
    end)

    it("tensor:set on a freed tensor reports 'was freed'", function()
      local t = lutra.tensor({ 2, 2 })
      t:destroy()
      local msg, raw = message_of(function() t:set({ 1, 2, 3, 4 }) end)
      assert.is_truthy(msg:find("was freed", 1, true),
                       string.format("error %q does not say the tensor was freed", raw))
    end)

    it("backward after the input saved by forward was freed reports 'was freed'", function()
      local m = lutra.nn.Linear(4, 3, { seed = 3 })
      local x = lutra.tensor({ 2, 4 }):randn(4211)
      m:forward(x)
      x:destroy()
      expect_error(function() m:backward(lutra.tensor({ 2, 3 }):randn(4212)) end,
                   "lutra_linear_backward", "was freed")
      all_zero(m:parameters()[1].grad:to_table(), "dW after a refused backward")
    end)

    it("a freed module, loss and optimizer report 'was freed'", function()
      local m = lutra.nn.Linear(4, 3, { seed = 4 })
      local x = lutra.tensor({ 2, 4 }):randn(4221)
      m:forward(x)
      m:destroy()
      expect_error(function() m:forward(x) end, "lutra_module_forward", "module was freed")
      expect_error(function() m:backward(lutra.tensor({ 2, 3 })) end, "lutra_module_backward",
                   "module was freed")
      expect_error(function() m:parameters() end, "lutra_module_num_params", "module was freed")
      expect_error(function() m:zero_grad() end, "lutra_module_zero_grad", "module was freed")
      expect_error(function() m:destroy() end, "lutra_module_destroy", "module was freed")
      expect_error(function() lutra.optim.SGD(m) end, "lutra_optim_new", "module was freed")
      expect_error(function() lutra.nn.Sequential(m) end, "lutra_sequential_new",
                   "module 1 was freed")

      local loss = lutra.nn.MSELoss()
      loss:destroy()
      expect_error(function() loss:forward(x, x) end, "lutra_loss_forward", "loss was freed")
      expect_error(function() loss:value() end, "lutra_loss_value", "loss was freed")

      local m2 = lutra.nn.Linear(4, 3, { seed = 5 })
      local opt = lutra.optim.SGD(m2, { lr = 0.1 })
      opt:destroy()
      local w = m2:parameters()[1].value:to_table()
      expect_error(function() opt:step() end, "lutra_optim_step", "optimizer was freed")
      expect_error(function() opt:set_lr(0.5) end, "lutra_optim_set_lr", "optimizer was freed")
      same(m2:parameters()[1].value:to_table(), w, "weights after a refused step")
    end)

    it("destroying a module that is inside a Sequential is refused; it keeps working", function()
      local a = lutra.nn.Linear(16, 8, { seed = 6 })
      local g = lutra.nn.GELU()
      local seq = lutra.nn.Sequential(a, g)
      expect_error(function() a:destroy() end, "lutra_module_destroy",
                   "module is still used by a Sequential")
      expect_error(function() g:destroy() end, "lutra_module_destroy",
                   "module is still used by a Sequential")
      local x = lutra.tensor({ 4, 16 }):randn(4231)
      local ref_a = lutra.nn.Linear(16, 8, { seed = 6 })
      local ref_seq = lutra.nn.Sequential(ref_a, lutra.nn.GELU())
      same(seq:forward(x):to_table(), ref_seq:forward(x):to_table(), "Sequential after refusals")
      local ref_single = lutra.nn.Linear(16, 8, { seed = 6 }) -- kept referenced: it owns its y
      same(a:forward(x):to_table(), ref_single:forward(x):to_table(), "child after refusals")
      -- once the Sequential is destroyed, the child can be
      seq:destroy()
      a:destroy()
      expect_error(function() a:forward(x) end, "lutra_module_forward", "module was freed")
      expect_error(function() seq:forward(x) end, "lutra_module_forward", "module was freed")
    end)
  end)

  describe("losses", function()
    local function xent_setup()
      local loss = lutra.nn.CrossEntropyLoss()
      local pred = lutra.tensor({ 3, 4 }):randn(4301)
      loss:forward(pred, lutra.from_table({ 0, 3, 1 }, { 3 }, "i32"))
      return loss, loss:value(), loss:backward():to_table()
    end

    it("labels out of range are refused by lutra_loss_forward", function()
      local loss = lutra.nn.CrossEntropyLoss()
      local pred = lutra.tensor({ 4, 5 }):randn(4311)
      local too_big = lutra.from_table({ 0, 5, 1, 2 }, { 4 }, "i32")
      local negative = lutra.from_table({ 0, 1, -1, 2 }, { 4 }, "i32")
      expect_error(function() loss:forward(pred, too_big) end, "lutra_loss_forward",
                   "out of range")
      expect_error(function() loss:forward(pred, negative) end, "lutra_loss_forward",
                   "out of range")
    end)

    it("a refused cross-entropy forward leaves the loss value and gradient as they were",
       function()
      local loss, v, g = xent_setup()
      -- same shape as the last forward
      local ok = pcall(function()
        loss:forward(lutra.tensor({ 3, 4 }):randn(4321),
                     lutra.from_table({ 0, 4, 1 }, { 3 }, "i32"))
      end)
      assert.is_false(ok)
      assert.are.equal(v, loss:value())
      same(loss:backward():to_table(), g, "dpred after a refused same-shape forward")
      -- another shape
      ok = pcall(function()
        loss:forward(lutra.tensor({ 5, 4 }):randn(4322),
                     lutra.from_table({ 0, 4, 1, 1, 1 }, { 5 }, "i32"))
      end)
      assert.is_false(ok)
      assert.are.equal(v, loss:value())
      assert.are.same({ 3, 4 }, loss:backward():dims())
      same(loss:backward():to_table(), g, "dpred after a refused forward of another shape")
    end)

    it("mismatched targets are refused and the loss keeps its value", function()
      local loss, v, g = xent_setup()
      expect_error(function() loss:forward(lutra.tensor({ 3, 4 }), lutra.tensor({ 3 })) end,
                   "lutra_loss_forward", "target must hold i32 class labels, not f32")
      expect_error(function()
        loss:forward(lutra.tensor({ 4, 4 }), lutra.from_table({ 0, 1, 2 }, { 3 }, "i32"))
      end, "lutra_loss_forward", "3 labels for 4 rows of pred")
      assert.are.equal(v, loss:value())
      same(loss:backward():to_table(), g, "dpred after refused forwards")

      local mse = lutra.nn.MSELoss()
      local p = lutra.tensor({ 3, 4 }):randn(4331)
      mse:forward(p, lutra.tensor({ 3, 4 }))
      local mv = mse:value()
      expect_error(function() mse:forward(p, lutra.tensor({ 4, 3 })) end, "lutra_loss_forward",
                   "target shape does not match pred")
      expect_error(function() mse:forward(p, lutra.tensor({ 3, 4 }, "bf16")) end,
                   "lutra_loss_forward", "target dtype bf16 does not match pred's f32")
      local labels = lutra.tensor({ 3 }, "i32")
      expect_error(function() mse:forward(labels, labels) end, "lutra_loss_forward",
                   "pred dtype i32")
      assert.are.equal(mv, mse:value())
    end)
  end)

  describe("construction", function()
    it("lutra.tensor refuses bad shapes", function()
      expect_error(function() lutra.tensor({ 0, 3 }) end, "lutra_tensor_new",
                   "dim 0 is 0; dims must be positive")
      expect_error(function() lutra.tensor({ 3, -2 }) end, "lutra_tensor_new", "dim 1 is -2")
      expect_error(function() lutra.tensor({ 1, 2, 3, 4, 5 }) end, "lutra.tensor",
                   "shape must have 1 to 4 dims")
      expect_error(function() lutra.tensor({}) end, "lutra.tensor", "shape must have 1 to 4 dims")
      expect_error(function() lutra.tensor({ 2.5, 2 }) end, "lutra.tensor",
                   "dim 1 must be an integer (got 2.5)")
      expect_error(function() lutra.tensor(4) end, "lutra.tensor", "shape must be a table")
    end)

    it("unknown dtype names are refused, and dtypes a call cannot take", function()
      expect_error(function() lutra.tensor({ 2 }, "f64") end, "lutra.tensor", "unknown dtype 'f64'")
      expect_error(function() lutra.nn.Linear(4, 4, { dtype = "fp32" }) end, "lutra.nn.Linear",
                   "unknown dtype 'fp32'")
      expect_error(function() lutra.nn.Linear(4, 4, { dtype = "f16" }) end, "lutra_linear_new",
                   "dtype must be f32 or bf16, got f16")
      expect_error(function() lutra.tensor({ 2 }, "e4m3") end, "lutra_tensor_new",
                   "cannot be created directly")
      -- the front refuses it before the C call (which would say the same)
      expect_error(function() lutra.nn.Linear(0, 4) end, "lutra.nn.Linear",
                   "in_features must be a positive integer (got 0)")
    end)

    it("unknown option keys are refused", function()
      expect_error(function() lutra.nn.Linear(4, 4, { biass = false }) end, "lutra.nn.Linear",
                   "unknown option 'biass'")
      local m = lutra.nn.Linear(4, 4)
      expect_error(function() lutra.optim.SGD(m, { lr = 0.1, momentun = 0.9 }) end,
                   "lutra.optim.SGD", "unknown option 'momentun'")
      expect_error(function() lutra.optim.AdamW(m, { beta = 0.9 }) end, "lutra.optim.AdamW",
                   "unknown option 'beta'")
      expect_error(function() lutra.autocast{ recipe = lutra.recipe.current{}, enable = true } end,
                   "lutra.autocast", "unknown option 'enable'")
    end)
  end)

  describe("optimizers", function()
    it("negative or non-finite hyperparameters are refused; set_lr keeps the old lr", function()
      local m = lutra.nn.Linear(3, 2, { seed = 9 })
      expect_error(function() lutra.optim.SGD(m, { lr = -0.1 }) end, "lutra_optim_new",
                   "lr must be finite and >= 0")
      expect_error(function() lutra.optim.AdamW(m, { lr = -1e-3 }) end, "lutra_optim_new",
                   "lr must be finite and >= 0")
      expect_error(function() lutra.optim.SGD(m, { lr = 0 / 0 }) end, "lutra_optim_new",
                   "lr must be finite and >= 0")
      expect_error(function() lutra.optim.SGD(m, { weight_decay = -1 }) end, "lutra_optim_new",
                   "weight_decay must be finite and >= 0")
      expect_error(function() lutra.optim.SGD(m, { momentum = 1 }) end, "lutra_optim_new",
                   "momentum must be in [0, 1)")
      expect_error(function() lutra.optim.AdamW(m, { beta2 = 1 }) end, "lutra_optim_new",
                   "beta1 and beta2 must be in [0, 1)")
      expect_error(function() lutra.optim.AdamW(m, { eps = 0 }) end, "lutra_optim_new",
                   "eps must be finite and > 0")
      expect_error(function() lutra.optim.SGD(lutra.nn.GELU()) end, "lutra_optim_new",
                   "has no parameters")

      local p = m:parameters()
      local w0 = p[1].value:to_table()
      local opt = lutra.optim.SGD(m, { lr = 0.25 })
      expect_error(function() opt:set_lr(-1) end, "lutra_optim_set_lr",
                   "lr must be finite and >= 0")
      expect_error(function() opt:set_lr(1 / 0) end, "lutra_optim_set_lr",
                   "lr must be finite and >= 0")
      local g = { 1, -2, 0.5, 4, -1, 0.25 }
      p[1].grad:set(g)
      opt:step()
      local w = p[1].value:to_table()
      for i = 1, #w do
        assert.is_true(math.abs(w[i] - (w0[i] - 0.25 * g[i])) <= 1e-6,
                       "the step did not use the lr from before the refused set_lr")
      end
    end)
  end)

  describe("lutra.gemm", function()
    it("inner dims that differ are refused and D is left untouched", function()
      local a = lutra.tensor({ 3, 4 }):randn(4401)
      local b = lutra.tensor({ 2, 5 }):randn(4402)
      local d = lutra.tensor({ 2, 3 }):fill(7)
      expect_error(function() lutra.gemm(a, true, b, false, d) end, "lutra_gemm",
                   "inner dims differ: A is 3x4, B is 2x5 in layout TN")
      expect_error(function() lutra.gemm(a, false, b, false, d) end, "lutra_gemm",
                   "inner dims differ")
      same(d:to_table(), { 7, 7, 7, 7, 7, 7 }, "D after refused GEMMs")
      local b4 = lutra.tensor({ 2, 4 }):randn(4403)
      local d33 = lutra.tensor({ 3, 3 }):fill(7)
      expect_error(function() lutra.gemm(a, true, b4, false, d33) end, "lutra_gemm",
                   "D is 3x3, expected 2x3")
      same(d33:to_table(), { 7, 7, 7, 7, 7, 7, 7, 7, 7 }, "D after a refused GEMM")
      -- the valid TN GEMM into d: D = B A^T
      lutra.gemm(a, true, b4, false, d)
      local av, bv, dv = a:to_table(), b4:to_table(), d:to_table()
      for i = 0, 1 do
        for j = 0, 2 do
          local s = 0
          for k = 1, 4 do s = s + bv[i * 4 + k] * av[j * 4 + k] end
          assert.is_true(math.abs(dv[i * 3 + j + 1] - s) <= 1e-5 * (1 + math.abs(s)))
        end
      end
    end)
  end)

  describe("error positions", function()
    it("point at the caller's line, not into lua/lutra", function()
      local t = lutra.tensor({ 2, 2 })
      t:destroy()
      for _, f in ipairs({
        function() local v = t:to_table(); return v end,
        function() local v = lutra.from_table({ 1 }, { 0 }); return v end,
        function() local v = lutra.from_table({ 1, 2 }, { 3 }); return v end,
        function() local v = lutra.tensor({ 0 }); return v end,
      }) do
        local _, raw = message_of(f)
        assert.is_truthy(raw:find("^[^%s:]*errors_spec%.lua:%d+: "),
                         string.format("error %q does not point at errors_spec.lua", raw))
      end
    end)
  end)

  describe("quantizers owned by a module", function()
    it("cannot be freed through the handle Linear:quantizer gives", function()
      local m = lutra.nn.Linear(32, 32, { seed = 5 })
      local x = lutra.tensor({ 16, 32 }):randn(6)
      local fp8 = lutra.autocast { recipe = lutra.recipe.current() }
      local y1 = fp8:run(function() return m:forward(x) end):to_table()
      local q = m:quantizer("input")
      local ok, err = pcall(q.destroy, q)
      assert.is_false(ok)
      assert.matches("lutra_quantizer_destroy: quantizer is owned by a module", err)
      -- and the module still works, with the same result
      local y2 = fp8:run(function() return m:forward(x) end):to_table()
      assert.are.same(y1, y2)
    end)
  end)
end)
