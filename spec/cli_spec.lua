-- The command lines of examples/train_mlp.lua and bench/*.lua, parsed with lua-argparse: the
-- options and defaults they had, what a run prints reflects the parsed values, and bad values
-- are refused with argparse's usage error. Skipped without lua-argparse.
local I = require("spec.support.install_tree")

local ENV = "LUA_PATH='lua/?.lua;lua/?/init.lua;;' OPENBLAS_NUM_THREADS=1 LUTRA_DEVICE=cpu "

local function run(args)
  return I.sh(ENV .. "luajit " .. args)
end

describe("command lines (lua-argparse)", function()
  if not pcall(require, "argparse") then
    pending("skipped: lua-argparse is not installed")
    return
  end

  it("train_mlp.lua: --help lists every option with its default", function()
    local ok, out = run("examples/train_mlp.lua --help")
    assert(ok, out)
    for _, want in ipairs {
      "--recipe {none,delayed,current,mxfp8,block}", "(default: delayed)",
      "--task {regression,classification}", "(default: regression)", "--steps", "(default: 300)",
      "--batch", "(default: 128)", "--hidden", "(default: 256)", "--lr", "(default: 0.003)",
      "--dtype {f32,bf16}", "(default: f32)", "--device {cpu,cuda}", "--every", "(default: 50)",
      "--graph {off,on}", "(default: off)" } do
      assert(out:find(want, 1, true), want .. " missing from\n" .. out)
    end
  end)

  it("train_mlp.lua: runs with the defaults and with the options given", function()
    -- (two steps do not converge: the example then exits 1 after printing what it ran)
    local _, out = run("examples/train_mlp.lua --steps 2 --every 1")
    assert(out:find("regression, recipe delayed, 2 steps, batch 128, hidden 256, f32 on cpu", 1,
                    true), out)
    assert(out:find("step     2  loss", 1, true), out)
    local _, given = run("examples/train_mlp.lua --recipe current --task classification " ..
                         "--steps 6 --every 3 --batch 32 --hidden 48 --lr 0.01 --dtype bf16")
    assert(given:find("classification, recipe current, 6 steps, batch 32, hidden 48, bf16 on cpu",
                      1, true), given)
    assert(given:find("step     3  loss", 1, true) and given:find("step     6  loss", 1, true), given)
    assert.is_nil(given:find("step     2  loss", 1, true), given)
  end)

  it("train_mlp.lua: refuses unknown options and bad values", function()
    for args, why in pairs {
      ["--recipe bogus"] = "must be one of 'none', 'delayed'",
      ["--steps many"] = "malformed argument 'many'",
      ["--graph maybe"] = "must be one of 'off', 'on'",
      ["--stepz 3"] = "unknown option '--stepz'",
    } do
      local ok, out = run("examples/train_mlp.lua " .. args)
      assert.is_false(ok, args .. " was accepted:\n" .. out)
      assert(out:find(why, 1, true), args .. ": " .. out)
      assert(out:find("Usage: train_mlp.lua", 1, true), out)
    end
  end)

  it("bench/host_overhead.lua and bench/overhead.lua: their options and defaults", function()
    local ok, out = run("bench/host_overhead.lua --help")
    assert(ok, out)
    for _, want in ipairs {
      "--device {cuda,cpu}", "(default: cuda)", "--batch", "--in", "--out", "(default: 64)",
      "--hidden", "(default: 128)", "--batches", "(default: 15)", "--floors-lib", "--torch",
      "--counts", "--count", "--table", "--quick" } do
      assert(out:find(want, 1, true), want .. " missing from\n" .. out)
    end
    local bad_ok, bad = run("bench/host_overhead.lua --batch x")
    assert.is_false(bad_ok, bad)
    assert(bad:find("malformed argument 'x'", 1, true), bad)
    ok, out = run("bench/overhead.lua --help")
    assert(ok and out:find("--out <out>", 1, true), out)
    local unknown_ok, unknown = run("bench/overhead.lua --bogus 1")
    assert.is_false(unknown_ok, unknown)
    assert(unknown:find("unknown option '--bogus'", 1, true), unknown)
  end)
end)
