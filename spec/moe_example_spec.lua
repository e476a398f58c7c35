-- examples/train_moe.lua runs and trains on the CPU in its --experts linear reference mode (each
-- expert an nn.Linear over its rows, the rest of the layer the lutra.moe router, permute and
-- unpermute), with and without FP8: the script itself exits 1 unless the loss falls below
-- 0.2 x the first and each cluster's top-1 routing is at least 80% one expert; and in its
-- default --experts grouped mode (nn.GroupedLinear), f32 and bf16.
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local function run(args)
  local p = assert(io.popen(string.format("{ %s examples/train_moe.lua %s; } 2>&1; echo \"exit=$?\"",
                                          LUAJIT, args)))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("exit=(%d+)%s*$")), out
end

describe("examples/train_moe.lua", function()
  for _, recipe in ipairs { "none", "delayed" } do
    it("trains and specialises its experts (--experts linear, recipe " .. recipe .. ")", function()
      local code, out = run("--experts linear --device cpu --steps 200 --recipe " .. recipe)
      assert.are.equal(0, code, out)
      local ratio = tonumber(out:match("= (%d+%.%d+) x the first"))
      local purity, start = out:match("top%-1 purity (%d+%.%d+) over %d+ clusters %((%d+%.%d+) at the start%)")
      assert.is_true(ratio and ratio < 0.2, out)
      assert.is_true(tonumber(purity) >= 0.8 and tonumber(purity) > tonumber(start), out)
    end)
  end

  it("trains in its default grouped mode (nn.GroupedLinear), f32 and bf16", function()
    for _, case in ipairs { { "none", "f32" }, { "delayed", "f32" }, { "none", "bf16" } } do
      local code, out = run(string.format("--device cpu --steps 200 --recipe %s --dtype %s",
                                          case[1], case[2]))
      assert.are.equal(0, code, out)
    end
  end)

  it("refuses a graph without device splits", function()
    local code, out = run("--experts linear --graph on --device cpu --steps 2")
    assert.are.equal(2, code, out)
    assert.matches("--graph on needs --device cuda and --experts grouped", out, 1, true)
  end)
end)
