--- nn.RotaryEmbedding: the rotary position embedding (RoPE) of attention's queries and keys
-- (src/lutra/rope.h), as TransformerEngine's RotaryPositionEmbedding + apply_rotary_pos_emb.
--   local rope = nn.RotaryEmbedding(64, { base = 10000 })
--   local q_rot = rope:forward(q)            -- q {B, T, H, 64}; a buffer the module owns
--   local dq = rope:backward(dq_rot)         -- the inverse rotation
--   rope:apply_qkv(qkv, 12, 4)               -- q and k heads of a fused QKV output, in place
-- Pair i < r/2 (r = rotary_dim) of the row at position p turns by p * base^(-2i/r): the pairs
-- (i, i + r/2) ("rotate half", TE's default) or (2i, 2i+1) with interleaved; dims from r on pass
-- through. Positions are the offset (set_offset, 0 by default) plus the sequence index.
-- @module lutra.rope
local core = require("lutra.core")
local chk = require("lutra.check")
local methods = require("lutra.module_methods")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local RotaryEmbedding = {}

local module_box = ffi.new("lutra_module*[1]")
-- the per-call checks: plain compares that compile into a loop's trace (chk builds the error)
local function is_integer(v) return type(v) == "number" and v % 1 == 0 end
local formats = { bshd = C.LUTRA_ROPE_BSHD, sbhd = C.LUTRA_ROPE_SBHD }
local format_names = { [tonumber(C.LUTRA_ROPE_BSHD)] = "bshd",
                       [tonumber(C.LUTRA_ROPE_SBHD)] = "sbhd" }

--- A rotary position embedding (no parameters). forward(x) takes x {B, T, H, head_dim}
-- ({T, B, H, head_dim} with qkv_format "sbhd") of the module's dtype and device and returns it
-- rotated; backward(dy) returns dx, the inverse rotation of dy at the last forward's positions.
-- The (cos, sin) table of max_seq positions is computed in f64 once, at construction, and kept
-- in f32; the rotation runs in f32, rounded once. A sequence passing max_seq (with the offset)
-- is refused: make the module with a larger max_seq.
-- @tparam integer head_dim the last dim of the tensors it takes (even)
-- @tparam[opt] table opts {base = 10000, rotary_dim = head_dim (even; the dims after it pass
-- through), max_seq = 4096, interleaved = false (pairs (2i, 2i+1) instead of (i, i + r/2)),
-- qkv_format = "bshd" | "sbhd", dtype = "f32" | "bf16" | "f16", device =}
-- @return the module
function M.RotaryEmbedding(head_dim, opts)
  local where = "lutra.nn.RotaryEmbedding"
  opts = core.check_options(opts, { base = true, rotary_dim = true, max_seq = true,
                                    interleaved = true, qkv_format = true, dtype = true,
                                    device = true }, where)
  local d = ffi.new("lutra_rope_desc")
  C.lutra_rope_defaults(d)
  d.head_dim = chk.integer(head_dim, "head_dim", where, 2, 2 ^ 20)
  if opts.rotary_dim ~= nil then
    d.rotary_dim = chk.integer(opts.rotary_dim, "rotary_dim", where, 2, 2 ^ 20)
  end
  if opts.max_seq ~= nil then
    d.max_seq = chk.integer(opts.max_seq, "max_seq", where, 1, 2 ^ 31 - 1)
  end
  if opts.base ~= nil then d.base = chk.finite(opts.base, "base", where) end
  d.interleaved = chk.flag(opts.interleaved, "interleaved", where, 0)
  if opts.qkv_format ~= nil then
    d.qkv_format = core.code(formats, opts.qkv_format, "qkv_format", where)
  end
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  check(C.lutra_rope_new(d, module_box))
  return ffi.gc(module_box[0], C.lutra_module_unref)
end

--- A RotaryEmbedding's own methods (nn.RotaryEmbedding), beside Module's.
-- @type RotaryEmbedding

--- Sets the position of sequence index 0 for the next forwards and apply_qkv calls (generation
-- with a key/value cache); a backward keeps its forward's positions. A CUDA graph replays the
-- offset it was captured with.
-- @tparam integer offset 0 .. max_seq - 1
-- @return the module
function RotaryEmbedding:set_offset(offset)
  if not is_integer(offset) then chk.integer(offset, "offset", "rope:set_offset") end
  check(C.lutra_rope_set_offset(self, offset))
  return self
end

--- Rotates in place the query and key heads of a fused QKV projection's output, packed
-- [q heads | k heads | v heads] along the last dim, in one backend call; the value heads are
-- left as they are. With inverse, the backward of that on the gradient of qkv.
-- @param qkv {B, T, (num_heads + 2 num_gqa_groups) * head_dim} or {B, T, num_heads + 2
-- num_gqa_groups, head_dim} (T and B swapped with "sbhd"), the module's dtype and device
-- @tparam integer num_heads the query heads
-- @tparam[opt] integer num_gqa_groups the key (and value) heads, dividing num_heads (default
-- num_heads)
-- @tparam[opt] boolean inverse the inverse rotation (default false)
-- @return qkv
function RotaryEmbedding:apply_qkv(qkv, num_heads, num_gqa_groups, inverse)
  if not chk.is_tensor(qkv) then chk.tensor(qkv, "qkv", "rope:apply_qkv") end
  if not is_integer(num_heads) then chk.integer(num_heads, "num_heads", "rope:apply_qkv") end
  num_gqa_groups = num_gqa_groups or num_heads
  if not is_integer(num_gqa_groups) then
    chk.integer(num_gqa_groups, "num_gqa_groups", "rope:apply_qkv")
  end
  if inverse ~= nil and type(inverse) ~= "boolean" then
    chk.boolean(inverse, "inverse", "rope:apply_qkv")
  end
  check(C.lutra_rope_apply_qkv(self, qkv, num_heads, num_gqa_groups, inverse and 1 or 0))
  return qkv
end

local desc_box, offset_box = ffi.new("lutra_rope_desc"), ffi.new("int64_t[1]")
-- names by code (no pairs() loop at load: a loop LuaJIT finds hot there aborts with NYI)
local dtype_names = require("lutra.tensor").dtype_names
local device_names = { [tonumber(C.LUTRA_CPU)] = "cpu", [tonumber(C.LUTRA_CUDA)] = "cuda" }

--- The module's settings as a table {head_dim, rotary_dim, base, max_seq, interleaved,
-- qkv_format, dtype, device, offset}.
-- @return the table
function RotaryEmbedding:settings()
  check(C.lutra_rope_get(self, desc_box, offset_box))
  local d = desc_box
  return { head_dim = tonumber(d.head_dim), rotary_dim = tonumber(d.rotary_dim),
           base = d.base, max_seq = tonumber(d.max_seq), interleaved = d.interleaved ~= 0,
           qkv_format = format_names[tonumber(d.qkv_format)],
           dtype = dtype_names[tonumber(d.dtype)], device = device_names[tonumber(d.device)],
           offset = tonumber(offset_box[0]) }
end

--- The line print(module) shows for a RotaryEmbedding.
-- @local internal: lutra.module_tree calls it
function M.describe(m)
  local s = RotaryEmbedding.settings(m)
  return string.format("lutra.nn.RotaryEmbedding(head_dim=%d, rotary_dim=%d, base=%g%s, %s, %s, "
                       .. "%s)", s.head_dim, s.rotary_dim, s.base,
                       s.interleaved and ", interleaved" or "", s.qkv_format, s.dtype, s.device)
end

methods.define("rotary_embedding", "RotaryEmbedding", RotaryEmbedding)

return M
