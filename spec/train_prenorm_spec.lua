-- examples/train_prenorm.lua, short (2 blocks, hidden 32, 60 steps, batch 512) on the CPU backend:
-- the pre-norm residual LayerNormMLP (swiglu) stack trains under every recipe, and each FP8
-- run's final loss is within 5% of the high-precision run's (FP8's rounding moves this loss,
-- which stays far above its noise floor, by about 1-2%), which itself falls below 0.8 of the
-- first loss.
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local function run(recipe)
  local cmd = string.format("%s examples/train_prenorm.lua --recipe %s --steps 60 --every 60 "
                            .. "--batch 512 --hidden 32 --ffn 32 --blocks 2 --device cpu 2>&1",
                            LUAJIT, recipe)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  local last, first = out:match("final loss ([%d%.e%-]+) %(first ([%d%.e%-]+)%)")
  assert(last, "no final loss in the output of " .. cmd .. ":\n" .. out)
  return tonumber(last), tonumber(first)
end

describe("examples/train_prenorm.lua", function()
  local ref
  it("trains in high precision", function()
    local last, first = run("none")
    assert.is_true(last < 0.8 * first, string.format("loss %.6f from %.6f", last, first))
    ref = last
  end)
  for _, r in ipairs { "delayed", "current", "mxfp8", "block" } do
    it(r .. ": the final loss is within 5% of the high-precision run's", function()
      assert.is_not_nil(ref, "the high-precision run failed")
      local last = run(r)
      assert.is_true(math.abs(last - ref) <= 0.05 * ref,
                     string.format("%s: %.6f vs %.6f", r, last, ref))
    end)
  end
end)
