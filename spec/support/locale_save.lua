-- One process of spec/checkpoint_values_spec.lua's locale case:
--   luajit locale_save.lua LOCALE IN OUT
-- LOCALE "C" or a locale name set for LC_NUMERIC with setlocale (as a host engine would); IN a
-- checkpoint to load first ("-": none); then saves to OUT. The model and optimizer are the same
-- in every process (seeded), lr 0.01, which no hex or decimal float holds exactly.
local ffi = require("ffi")
ffi.cdef [[
char *setlocale(int category, const char *locale);
int snprintf(char *s, size_t n, const char *format, ...);
]]
local lutra = require("lutra")
local locale_name, inp, out = unpack(arg)
if locale_name ~= "C" then
  local LC_NUMERIC = 1 -- glibc's
  local got = ffi.C.setlocale(LC_NUMERIC, locale_name)
  if got == nil then
    print("no locale " .. locale_name)
    os.exit(3)
  end
end
-- the premise of the case: the process's C printf writes the locale's decimal point (LuaJIT's
-- own string.format does not use the locale)
local buf = ffi.new("char[16]")
ffi.C.snprintf(buf, 16, "%.1f", ffi.new("double", 0.5))
io.write("decimal point: ", ffi.string(buf):sub(2, 2), "\n")
lutra.manual_seed(11)
local net = lutra.nn.Sequential(lutra.nn.Linear(16, 16))
local opt = lutra.optim.AdamW(net, { lr = 0.01 })
if inp ~= "-" then
  local ok, err = pcall(lutra.load, inp, { model = net, optim = opt })
  if not ok then
    print("load failed: " .. tostring(err))
    os.exit(2)
  end
end
lutra.save(out, { model = net, optim = opt })
print("saved")
