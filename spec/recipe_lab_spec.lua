-- The recipe lab (examples/recipe_lab.lua), short, on the CPU: its CSV traces and table are
-- complete and consistent with each other, the f32 reference's ratio is 1, the user-written
-- rule ran (its scales differ from the built-in delayed recipe's), and without gnuplot it says
-- the plot was skipped. (CI runs this: the lab's smoke test.)
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local function read_lines(path)
  local t = {}
  for line in io.lines(path) do t[#t + 1] = line end
  return t
end

local function split(line)
  local t = {}
  for v in (line .. ","):gmatch("([^,]*),") do t[#t + 1] = v end
  return t
end

describe("the recipe lab", function()
  it("writes the loss and scale traces and the table of final losses against f32", function()
    local out = os.tmpname()
    os.remove(out)
    local steps = 12
    local cmd = string.format("LUTRA_LAB_GNUPLOT=none LUTRA_DEVICE=cpu %s examples/recipe_lab.lua " ..
                              "--steps %d --hidden 32 --depth 3 --batch 32 --out %s 2>&1",
                              LUAJIT, steps, out)
    local p = assert(io.popen(cmd))
    local log = p:read("*a")
    p:close()
    assert.truthy(log:find("plot skipped: gnuplot is not installed", 1, true), log)

    local loss = read_lines(out .. "/loss.csv")
    local header = split(loss[1])
    assert.are.same({ "step", "f32", "delayed", "current", "mxfp8", "block", "ema_rule", "head_hp",
                      "delayed_bwd_hp", "nvfp4" }, header)
    assert.are.equal(steps + 1, #loss)
    local final = {}
    for s = 1, steps do
      local row = split(loss[s + 1])
      assert.are.equal(tostring(s), row[1])
      for c = 2, #header do
        local v = tonumber(row[c])
        assert.truthy(v and v == v and v > 0 and v < 10, loss[s + 1])
        if s == steps then final[header[c]] = v end
      end
    end
    -- training moved every recipe's loss down from the first step
    local first = split(loss[2])
    for c = 2, #header do assert.is_true(final[header[c]] < tonumber(first[c]), header[c]) end

    -- the table: one row per recipe, its final loss and ratio as in loss.csv
    local tbl = read_lines(out .. "/table.md")
    local rows = {}
    for _, line in ipairs(tbl) do
      local name, fl, ratio = line:match("^| (%S+) | ([%d%.e%-]+) | ([%d%.]+) |$")
      if name then rows[name] = { tonumber(fl), tonumber(ratio) } end
    end
    for c = 2, #header do
      local r = rows[header[c]]
      assert.is_not_nil(r, header[c])
      assert.is_true(math.abs(r[1] - final[header[c]]) <= 1e-5 * final[header[c]], header[c])
      assert.is_true(math.abs(r[2] - final[header[c]] / final.f32) <= 1e-4, header[c])
    end
    assert.are.equal(1, rows.f32[2])

    -- scales: rows for the per-tensor recipes, the Lua rule's differ from the built-in's
    local scales = read_lines(out .. "/scales.csv")
    assert.are.equal("recipe,step,layer,role,scale,amax", scales[1])
    local by = {}
    for i = 2, #scales do
      local r = split(scales[i])
      by[r[1]] = by[r[1]] or {}
      by[r[1]][r[2] .. ":" .. r[3] .. ":" .. r[4]] = tonumber(r[5])
    end
    for _, name in ipairs { "delayed", "current", "ema_rule", "head_hp", "delayed_bwd_hp" } do
      assert.is_not_nil(by[name], name)
      assert.is_not_nil(by[name][steps .. ":1:input"], name)
    end
    assert.is_nil(by.f32)
    assert.is_nil(by.mxfp8)
    assert.are_not.equal(by.delayed[steps .. ":1:input"], by.ema_rule[steps .. ":1:input"])
    assert.is_nil(by.head_hp[steps .. ":3:input"]) -- the head runs in high precision
    os.execute("rm -rf '" .. out .. "'")
  end)

  it("--model gpt: the GPT on a corpus, validation losses in the table, projections' scales",
     function()
    local data = os.tmpname()
    os.remove(data)
    assert(os.execute("mkdir -p '" .. data .. "'"))
    local text = {}
    for i = 1, 30000 do text[i] = string.char(math.random(97, 100)) end -- 4 letters: learnable
    local f = assert(io.open(data .. "/shakespeare.txt", "wb"))
    f:write(table.concat(text))
    f:close()
    local out = data .. "/lab"
    local steps = 15
    local cmd = string.format("LUTRA_DATA='%s' LUTRA_LAB_GNUPLOT=none LUTRA_DEVICE=cpu %s "
                              .. "examples/recipe_lab.lua --model gpt --steps %d --hidden 32 "
                              .. "--layers 3 --batch 4 --seq 16 --lr 0.01 --out %s 2>&1", data,
                              LUAJIT, steps, out)
    local p = assert(io.popen(cmd))
    local log = p:read("*a")
    p:close()
    assert.truthy(log:find("final: validation loss", 1, true), log)
    local loss = read_lines(out .. "/loss.csv")
    local header = split(loss[1])
    local first = split(loss[2])
    local rows = {}
    for _, line in ipairs(read_lines(out .. "/table.md")) do
      local name, fl = line:match("^| (%S+) | ([%d%.e%-]+) | [%d%.]+ |$")
      if name then rows[name] = tonumber(fl) end
    end
    for c = 2, #header do
      -- ln 256 = 5.55 at the start; 4 equally likely letters give ln 4 = 1.39 at best
      assert.is_true(rows[header[c]] < tonumber(first[c]) and rows[header[c]] > 1.3, header[c])
    end
    -- the middle layer (the only FP8 one of 3) is traced
    local scales = read_lines(out .. "/scales.csv")
    local traced = {}
    for i = 2, #scales do traced[split(scales[i])[1] .. ":" .. split(scales[i])[3]] = true end
    assert.is_true(traced["delayed:1"] and traced["current:1"], log)
    os.execute("rm -rf '" .. data .. "'")
  end)
end)
