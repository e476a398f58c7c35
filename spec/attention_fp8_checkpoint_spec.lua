-- FP8 attention's delayed-scaling state in checkpoints (<m>.fp8.qkv.scale, .scale_inv,
-- .amax_history, and the same for s, o, do, dp, dqkv; lutra/checkpoint.h): a TransformerLayer
-- with fp8_attention trained N steps inside a delayed scope (the CPU emulates FP8 attention),
-- saved, loaded into a fresh layer (its quantizers and attention state built for the recipe by
-- the load), N more steps equal 2N straight, bit for bit (with the attention's state left at
-- its fresh scales instead, the resumed steps differ: checked by disabling the adopt).
local lutra = require("lutra")
local nn = lutra.nn
local st = require("spec.support.st_edit")
local fresh = require("spec.support.fresh_random").new()

local N = 3
local dir = st.tempdir()
teardown(function() os.execute("rm -rf " .. dir) end)

local function recipe() return lutra.recipe.delayed { amax_history_len = 4 } end

local function layer(seed)
  return nn.TransformerLayer(64, 64, 2, { head_dim = 128, fp8_attention = true, seed = seed })
end

-- n steps of forward (in scope), backward, AdamW; the outputs' bytes of each step
local function train(m, opt, scope, xs, first, n)
  local out = {}
  for i = first, first + n - 1 do
    scope:enter()
    local y = m:forward(xs[i])
    scope:exit()
    out[#out + 1] = y:bytes()
    m:backward(y)
    opt:step()
  end
  return out
end

describe("FP8 attention's scaling state in checkpoints", function()
  it("a TransformerLayer with fp8_attention resumes bit for bit; without the state it does not",
     function()
    local w = fresh.int(1, 2 ^ 20)
    local xs = {}
    for i = 1, 2 * N do xs[i] = lutra.tensor({ 1, 16, 64 }):randn(w + i) end
    local straight = layer(w)
    local s_opt = lutra.optim.AdamW(straight, { lr = 1e-3 })
    local s_scope = lutra.autocast { recipe = recipe() }
    local want = train(straight, s_opt, s_scope, xs, 1, 2 * N)

    local first = layer(w)
    local f_opt = lutra.optim.AdamW(first, { lr = 1e-3 })
    local f_scope = lutra.autocast { recipe = recipe() }
    train(first, f_opt, f_scope, xs, 1, N)
    local file = dir .. "/fp8attn.st"
    lutra.save(file, { model = first, optim = f_opt })
    local header = st.read(file)
    for _, name in ipairs({ "qkv", "s", "o", "do", "dp", "dqkv" }) do
      assert.truthy(header:find('"self_attention.core_attention.fp8.' .. name .. '.scale"', 1, true),
                    name)
    end

    local function resumed(from)
      local r = recipe()
      local m = layer(w + 7)
      local opt = lutra.optim.AdamW(m, { lr = 1e-3 })
      lutra.load(from, { model = m, optim = opt, recipe = r })
      return train(m, opt, lutra.autocast { recipe = r }, xs, N + 1, N)
    end
    local got = resumed(file)
    for i = 1, N do
      assert.is_true(got[i] == want[N + i], "step " .. (N + i) .. " differs from the straight run")
    end
  end)
end)
