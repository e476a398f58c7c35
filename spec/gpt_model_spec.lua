-- examples/gpt/model.lua, the GPT of the example and the benchmark, on the CPU: its forward is
-- the modules composed by hand (embeddings added, layers, norm, tied head), its backward gives
-- every parameter the gradient finite differences give, FP8 scope bounds, and the MFU count.
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local model = require("model")
local nn = lutra.nn

local SEED = os.time() % 100000

local function tiny(positions)
  lutra.manual_seed(SEED)
  return model.new({ vocab = 11, dim = 8, layers = 2, heads = 2, seq = 5, positions = positions,
                     dtype = "f32", device = "cpu" })
end

local function random_ids(b, t, v, seed)
  math.randomseed(seed)
  local ids = {}
  for i = 1, b * t do ids[i] = math.random(0, v - 1) end
  return lutra.from_table(ids, { b, t }, "i32", "cpu")
end

local function max_diff(a, b)
  local x, y, worst = a:to_table(), b:to_table(), 0
  assert.are.equal(#y, #x)
  for i = 1, #x do worst = math.max(worst, math.abs(x[i] - y[i])) end
  return worst
end

describe("examples/gpt/model", function()
  it("forward equals the modules composed by hand, bit for bit", function()
    local gpt = tiny("learned")
    local ids = random_ids(3, 5, 11, SEED)
    local got = gpt:forward(ids, false):to_table()
    local h = lutra.add(gpt.tok:forward(ids, { grad = false }),
                        gpt.pos:forward(gpt:positions(3, 5), { grad = false }))
    for _, layer in ipairs(gpt.layers) do h = layer:forward(h, { grad = false }) end
    local want = gpt.head:forward(gpt.norm:forward(h, { grad = false }), { grad = false })
    assert.are.same(want:dims(), { 3, 5, 11 })
    assert.are.same(want:to_table(), got)
  end)

  for _, positions in ipairs({ "learned", "rope" }) do
    it("backward matches finite differences of the loss (" .. positions .. " positions)", function()
      local gpt = tiny(positions)
      local ids, targets = random_ids(2, 5, 11, SEED + 1), random_ids(2, 5, 11, SEED + 2)
      local loss = nn.CrossEntropyLoss()
      local function value()
        loss:forward(gpt:forward(ids, false), targets)
        return loss:value()
      end
      loss:forward(gpt:forward(ids, true), targets)
      gpt:backward(loss:backward())
      -- the tied embedding (gradient from the head and the lookup), a position and a layer weight
      local params = gpt.all:parameters()
      local checked = 0
      for pi, p in ipairs(params) do
        if pi == 1 or pi == 2 or pi == #params then
          local v, g = p.value:to_table(), p.grad:to_table()
          for _, i in ipairs({ 1, 7, #v }) do
            local old, e = v[i], 1e-3
            v[i] = old + e; p.value:set(v); local up = value()
            v[i] = old - e; p.value:set(v); local down = value()
            v[i] = old; p.value:set(v)
            local fd = (up - down) / (2 * e)
            -- f32 loss (~2.4, ulp 2.4e-7) over 2e-3: ~2e-4 of rounding; the embeddings are
            -- N(0, 0.02), so the LayerNorms are sharply curved there and h 1e-3 leaves ~1e-4 of
            -- truncation (h 1e-2 leaves ~5e-3, measured)
            assert.is_true(math.abs(fd - g[i]) <= 1.5e-3 + 2e-2 * math.abs(fd),
                           string.format("param %d [%d]: fd %.6f grad %.6f (seed %d)", pi, i, fd,
                                         g[i], SEED))
            checked = checked + 1
          end
        end
      end
      assert.are.equal(9, checked)
    end)
  end

  it("with moe, every layer's feed-forward is an MoEMLP and a repeated batch is learned", function()
    lutra.manual_seed(SEED)
    local gpt = model.new({ vocab = 11, dim = 16, layers = 2, heads = 2, seq = 5, dtype = "f32",
                            device = "cpu", moe = { experts = 3, top_k = 2 } })
    for _, layer in ipairs(gpt.layers) do
      assert.truthy(tostring(layer:part("mlp")):find("MoEMLP", 1, true), tostring(layer))
    end
    local ids, targets = random_ids(2, 5, 11, SEED + 3), random_ids(2, 5, 11, SEED + 4)
    local loss = nn.CrossEntropyLoss()
    local opt = lutra.optim.AdamW(gpt.all, { lr = 1e-2 })
    local first
    for step = 1, 30 do
      loss:forward(gpt:forward(ids, true), targets)
      gpt:backward(loss:backward())
      opt:step()
      first = first or loss:value()
    end
    assert.is_true(loss:value() < 0.5 * first, string.format("%.3f -> %.3f", first, loss:value()))
  end)

  it("counts the FLOPs of a step as 6 N + 12 L T d with N less the position table", function()
    local gpt = tiny("learned")
    local n = 0
    for _, p in ipairs(gpt.all:parameters()) do n = n + p.value:size() end
    assert.are.equal(n - 5 * 8, gpt:flop_params())
    assert.are.equal(6 * (n - 5 * 8) + 12 * 2 * 5 * 8, gpt:flops_per_token())
  end)

  it("runs the LM head in FP8 when set_fp8 asks for it, and only then", function()
    -- ||a - b||^2 / ||b||^2
    local function nmse(a, b)
      local x, y, num, den = a:to_table(), b:to_table(), 0, 0
      for i = 1, #y do
        num = num + (x[i] - y[i]) ^ 2
        den = den + y[i] ^ 2
      end
      return num / den
    end
    local ids, targets = random_ids(2, 8, 32, SEED + 5), random_ids(2, 8, 32, SEED + 6)
    -- the same weights and batch, every layer in FP8 (current scaling), the head as asked
    local function run(head)
      lutra.manual_seed(SEED)
      local gpt = model.new({ vocab = 32, dim = 16, layers = 2, heads = 2, seq = 8,
                              dtype = "f32", device = "cpu" })
      gpt:set_fp8(lutra.autocast { recipe = lutra.recipe.named("current") }, 1, 2, head)
      local loss = nn.CrossEntropyLoss()
      local logits = gpt:forward(ids, true)
      loss:forward(logits, targets)
      gpt:backward(loss:backward())
      return gpt, logits, gpt.tok:parameters()[1].grad
    end
    local plain, logits0, grad0 = run(false)
    local fp8, logits1, grad1 = run(true)
    assert.is_false(plain.fp8_head)
    assert.is_true(fp8.fp8_head)
    -- E4M3 operands (3 mantissa bits: relative rounding up to 2^-4, ~1e-3 in NMSE) in the head's
    -- forward; E5M2 gradients (2^-3) in its backward, the tied weight's gradient also summing
    -- the lookup's exact part
    local fwd, bwd = nmse(logits1, logits0), nmse(grad1, grad0)
    assert.is_true(fwd > 0 and fwd < 1e-2, string.format("logits NMSE %.3g (seed %d)", fwd, SEED))
    assert.is_true(bwd > 0 and bwd < 5e-2, string.format("grad NMSE %.3g (seed %d)", bwd, SEED))
    -- without a scope the head stays out, whatever head says
    fp8:set_fp8(nil, nil, nil, true)
    assert.is_false(fp8.fp8_head)
  end)

  it("keeps the first and last layers out of the FP8 scope by default", function()
    lutra.manual_seed(SEED)
    local gpt = model.new({ vocab = 11, dim = 8, layers = 4, heads = 2, seq = 5, dtype = "f32",
                            device = "cpu" })
    gpt:set_fp8({})
    assert.are.same({ 2, 3 }, { gpt.fp8_first, gpt.fp8_last })
    gpt:set_fp8({}, 1, 4)
    assert.are.same({ 1, 4 }, { gpt.fp8_first, gpt.fp8_last })
  end)
end)

describe("lutra.device_memory", function()
  it("is nil on the cpu, and the C call refuses missing outputs and the cpu", function()
    assert.is_nil(lutra.device_memory("cpu"))
    local C = require("lutra.core").C
    local box = lutra.ffi.new("int64_t[2]", 7, 9)
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_device_memory(C.LUTRA_CPU, 0, nil, box))
    local function last_error() return lutra.ffi.string(C.lutra_last_error()) end
    assert.matches("lutra_device_memory: in_use and peak", last_error(), 1, true)
    assert.are.equal(C.LUTRA_EUNSUPPORTED, C.lutra_device_memory(C.LUTRA_CPU, 0, box, box + 1))
    assert.matches("does not count its memory", last_error(), 1, true)
    assert.are.same({ 7, 9 }, { tonumber(box[0]), tonumber(box[1]) })
  end)
end)
