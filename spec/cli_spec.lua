-- The command lines of examples/train_{mlp,moe,prenorm}.lua and bench/*.lua, parsed with
-- lua-argparse: the
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
  -- --help of each script lists every option with the default it had; a bad value, a bad choice
  -- and an unknown option are each refused with argparse's usage error
  local function check(script, wants, bads)
    local name = script:match("([^/]+)$")
    local ok, out = run(script .. " --help")
    assert(ok, out)
    assert(out:find("Usage: " .. name, 1, true), out)
    for _, want in ipairs(wants) do
      assert(out:find(want, 1, true), script .. ": " .. want .. " missing from\n" .. out)
    end
    for args, why in pairs(bads) do
      local bad_ok, bad = run(script .. " " .. args)
      assert.is_false(bad_ok, args .. " was accepted:\n" .. bad)
      assert(bad:find(why, 1, true), script .. " " .. args .. ": " .. bad)
      assert(bad:find("Usage: " .. name, 1, true), bad)
    end
  end

  it("bench/rules_overhead.lua: its options, defaults and refusals; a short run prints both rows",
     function()
    check("bench/rules_overhead.lua", {
      "--device {cpu,cuda}", "--steps", "(default: 2000)", "--depth", "(default: 4)", "--reps",
      "(default: 5)" }, {
      ["--reps some"] = "malformed argument 'some'",
      ["--device tpu"] = "must be one of 'cpu', 'cuda'",
      ["--rep 2"] = "unknown option '--rep'",
    })
    local ok, out = run("bench/rules_overhead.lua --device cpu --steps 3 --depth 2 --reps 1")
    assert(ok, out)
    assert(out:find("2 Linears of 64, 3 steps x 1 repetitions", 1, true), out)
    assert(out:find("| built-in delayed |", 1, true) and out:find("| Lua rule |", 1, true), out)
  end)

  it("bench/gpt_bench.lua: --recipes takes NAME, NAME+head and NAME+all, and refuses others",
     function()
    -- the breakdown's tables on the cpu (the tiny config): one a recipe, its name in the title
    local ok, out = run("bench/gpt_bench.lua --device cpu --breakdown tiny "
                        .. "--recipes delayed+head,current+all")
    assert(ok, out)
    assert(out:find("# tiny delayed+head:", 1, true) and out:find("# tiny current+all:", 1, true),
           out)
    assert(out:find("| final norm + head forward |", 1, true), out)
    local bad_ok, bad = run("bench/gpt_bench.lua --device cpu --breakdown tiny "
                            .. "--recipes delayed+tail 2>&1")
    assert.is_false(bad_ok, bad)
    assert(bad:find("recipe delayed+tail is not NAME, NAME+head or NAME+all", 1, true), bad)
    bad_ok, bad = run("bench/gpt_bench.lua --device cpu --breakdown tiny --recipes delayed+ 2>&1")
    assert.is_false(bad_ok, bad)
    assert(bad:find("recipe delayed+ is not NAME", 1, true), bad)
  end)

  it("train_moe.lua: its options, defaults and refusals", function()
    check("examples/train_moe.lua", {
      "--experts {grouped,linear}", "(default: grouped)",
      "--recipe {none,delayed,current,mxfp8,block}", "(default: none)",
      "--graph {off,on}", "(default: off)", "--device {cpu,cuda}", "--steps", "(default: 400)",
      "--batch", "(default: 256)", "--num-experts", "(default: 8)", "--clusters", "--k",
      "(default: 2)", "--hidden", "(default: 64)", "--lr", "(default: 0.01)", "--every",
      "(default: 100)", "--dtype {auto,f32,bf16}", "(default: auto)" }, {
      ["--dtype f16"] = "must be one of 'auto', 'f32', 'bf16'",
      ["--experts dense"] = "must be one of 'grouped', 'linear'",
      ["--num-experts lots"] = "malformed argument 'lots'",
      ["--expert linear"] = "unknown option '--expert'",
    })
  end)

  it("train_moe.lua: the parsed values reach the run", function()
    local _, out = run("examples/train_moe.lua --experts linear --device cpu --steps 2 --every 1 "
                       .. "--num-experts 4 --clusters 4 --k 1 --batch 64 --hidden 16 --dtype f32")
    assert(out:find("top-1 MoE, 4 experts (linear), 4 clusters, batch 64, recipe none, "
                    .. "graph off, on cpu", 1, true), out)
    assert(out:find("step     1  loss", 1, true) and out:find("step     2  loss", 1, true), out)
    -- the cross-option rule stays: the linear reference mode runs in f32 only
    local ok, bf = run("examples/train_moe.lua --experts linear --device cpu --dtype bf16 "
                       .. "--steps 1")
    assert.is_false(ok, bf)
    assert(bf:find("--experts linear runs in f32", 1, true), bf)
  end)

  it("train_prenorm.lua: its options, defaults and refusals", function()
    check("examples/train_prenorm.lua", {
      "--recipe {none,delayed,current,mxfp8,block}", "(default: delayed)", "--steps",
      "(default: 300)", "--blocks", "(default: 4)", "--hidden", "--ffn", "(default: 64)",
      "--batch", "(default: 1024)", "--lr", "(default: 0.003)", "--dtype {f32,bf16}",
      "(default: f32)", "--device {cpu,cuda}", "--every", "(default: 50)" }, {
      ["--recipe fp4"] = "must be one of 'none', 'delayed'",
      ["--blocks two"] = "malformed argument 'two'",
      ["--dtype f64"] = "must be one of 'f32', 'bf16'",
      ["--layers 2"] = "unknown option '--layers'",
    })
  end)

  it("bench/grouped_bench.lua and bench/moe_permute.lua: their options, defaults and refusals",
     function()
    check("bench/grouped_bench.lua", {
      "--part {host,gemm,fp8,step,all}", "(default: all)", "--rows", "(default: 16)", "--in",
      "--out", "(default: 64)", "--batches", "(default: 15)", "--calls", "(default: 200)", "--quick",
      "--floors-lib", "(default: build/libhost_floors.so)", "--device {cuda,cpu}",
      "(default: cuda)" }, {
      ["--part both"] = "must be one of 'host', 'gemm', 'fp8', 'step', 'all'",
      ["--calls x"] = "malformed argument 'x'",
      ["--device gpu"] = "must be one of 'cuda', 'cpu'",
      ["--row 8"] = "unknown option '--row'",
    })
    check("bench/moe_permute.lua", {
      "--device {cuda,cpu}", "(default: cuda)", "--floors-lib", "--out", "--quick" }, {
      ["--device gpu"] = "must be one of 'cuda', 'cpu'",
      ["--quick 1"] = "too many arguments",
      ["--iters 3"] = "unknown option '--iters'",
    })
  end)

  it("bench/dist_overhead.lua: --device, --reps, --calls, and only launcher rank 0 speaks",
     function()
    check("bench/dist_overhead.lua", { "--device {cpu,cuda}", "(default: cpu)", "--reps",
                                       "(default: 41)", "--calls", "(default: 0)" }, {
      ["--device gpu"] = "must be one of 'cpu', 'cuda'",
      ["--ranks 2"] = "unknown option '--ranks'",
      ["--reps 0"] = "--reps must be a whole number >= 1",
      ["--calls 1.5"] = "--calls must be a whole number >= 0",
    })
    -- another rank of the same mpirun (its launcher rank in the environment) exits the same
    -- way without printing, so the help and the error appear once
    local ok, out = run("bench/dist_overhead.lua --help 2>&1 | cat; " .. ENV ..
                        "OMPI_COMM_WORLD_RANK=1 luajit bench/dist_overhead.lua --help")
    assert(ok, out)
    local _, helps = out:gsub("Usage: dist_overhead.lua", "")
    assert.are.equal(1, helps, out)
    local bad_ok, bad = run("bench/dist_overhead.lua --device gpu 2>&1 | cat; " .. ENV ..
                            "OMPI_COMM_WORLD_RANK=1 luajit bench/dist_overhead.lua --device gpu")
    assert.is_false(bad_ok, bad)
    local _, errors = bad:gsub("must be one of", "")
    assert.are.equal(1, errors, bad)
  end)

  -- every example's enumerated options offer their values, and a value outside them is a usage
  -- error with exit status 2, not a stack trace (issue 40: train_resumable.lua --recipe bogus)
  it("examples: a value outside an option's choices is a usage error, status 2, no trace", function()
    local cases = {
      { "examples/train_resumable.lua", "--recipe bogus", "'none', 'delayed', 'current', 'mxfp8', 'block'" },
      { "examples/train_resumable.lua", "--dtype f64", "must be one of 'f32', 'bf16'" },
      { "examples/train_resumable.lua", "--device tpu", "must be one of 'cpu', 'cuda'" },
      { "examples/train_mlp.lua", "--recipe bogus", "must be one of 'none', 'delayed'" },
      { "examples/train_moe.lua", "--experts some", "must be one of 'grouped', 'linear'" },
      { "examples/train_prenorm.lua", "--dtype f8", "must be one of 'f32', 'bf16'" },
      { "examples/recipe_lab.lua", "--device tpu", "must be one of 'cpu', 'cuda'" },
    }
    for _, c in ipairs(cases) do
      local script, args, why = c[1], c[2], c[3]
      local _, out, code = run(script .. " " .. args)
      assert.are.equal(2, code, script .. " " .. args .. ":\n" .. out)
      assert(out:find(why, 1, true), script .. " " .. args .. ": " .. out)
      assert(out:find("Usage: " .. script:match("([^/]+)$"), 1, true), out)
      assert.is_nil(out:find("stack traceback", 1, true), out)
    end
  end)
end)
