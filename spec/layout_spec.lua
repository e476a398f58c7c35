-- The cdef LuaJIT uses is generated from lutra.h; this checks that LuaJIT lays out every struct
-- the front reads or fills exactly as the C compiler did when it built the library.
local lutra = require("lutra")
local ffi, C = lutra.ffi, lutra.C

describe("struct layout", function()
  local entries = {}
  local t, f = ffi.new("const char*[1]"), ffi.new("const char*[1]")
  local off, size = ffi.new("size_t[1]"), ffi.new("size_t[1]")
  local i = 0
  while C.lutra_layout(i, t, f, off, size) == 0 do
    entries[#entries + 1] = { type = ffi.string(t[0]), field = ffi.string(f[0]),
                              offset = tonumber(off[0]), size = tonumber(size[0]) }
    i = i + 1
  end

  it("lists the structs Lua reads", function()
    local types = {}
    for _, e in ipairs(entries) do types[e.type] = true end
    for _, name in ipairs { "lutra_tensor", "lutra_delayed_desc", "lutra_current_desc",
                            "lutra_mxfp8_desc", "lutra_block_desc", "lutra_custom_desc",
                            "lutra_linear_desc", "lutra_param", "lutra_optim_desc",
                            "lutra_gemm_epilogue", "lutra_norm_desc",
                            "lutra_moe_router_desc", "lutra_attention_desc" } do
      assert.is_true(types[name], name .. " is missing from lutra_layout")
    end
  end)

  it("matches LuaJIT's sizes and offsets for every field", function()
    assert.is_true(#entries > 40)
    for _, e in ipairs(entries) do
      if e.field == "" then
        assert.are.equal(e.size, ffi.sizeof(e.type), "sizeof(" .. e.type .. ")")
      else
        assert.are.equal(e.offset, ffi.offsetof(e.type, e.field), e.type .. "." .. e.field)
        -- arrays, pointers and 64-bit integers come back as cdata and have a size; 32-bit
        -- scalars come back as numbers, and the offset checks below bound their size
        local value = ffi.new(e.type)[e.field]
        if type(value) == "cdata" then
          assert.are.equal(e.size, ffi.sizeof(value), e.type .. "." .. e.field .. " size")
        end
      end
    end
  end)

  it("covers every field of the tensor struct", function()
    local fields = {}
    for _, e in ipairs(entries) do
      if e.type == "lutra_tensor" and e.field ~= "" then fields[#fields + 1] = e end
    end
    table.sort(fields, function(a, b) return a.offset < b.offset end)
    -- consecutive fields leave no unexplained gap, and the last one ends the struct
    local ends = 0
    for _, e in ipairs(fields) do
      assert.is_true(e.offset >= ends, e.field .. " overlaps the previous field")
      assert.is_true(e.offset - ends < 8, "gap before " .. e.field .. ": a field is missing")
      ends = e.offset + e.size
    end
    assert.is_true(ffi.sizeof("lutra_tensor") - ends < 8, "trailing fields are missing")
  end)
end)
