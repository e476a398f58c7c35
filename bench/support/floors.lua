-- The floors library (bench/host_floors.cu and bench/host_replay.cu, built into
-- build/libhost_floors.so) as the benchmark scripts load it into their own process, so that a
-- floor and the lutra figure it belongs to are timed side by side (bench/*.lua, run from the
-- repository root: require("bench.support.floors")). Not a benchmark itself.
local ffi = require("ffi")

ffi.cdef [[
  int hf_init(int64_t M, int64_t K, int64_t N);
  int hf_issue(int floor, int calls);
  int hf_sync(void);
  const char *hf_describe(void);
  int hf_available(int floor);
  const char *const hf_names[64]; /* NULL-terminated */
  int hf_replay_stream(void **stream_out);
  int hf_replay_sync(void);
  int hf_replay_begin(void **stream_out);
  int hf_replay_end(int slot);
  int hf_replay_abort(void);
  int hf_replay_counts(int slot, int64_t *kernels, int64_t *copies, int64_t *memsets,
                       int64_t *graphs, int64_t *skipped);
  int hf_replay_issue(int slot, int calls);
  int hf_replay_free(int slot);
]]

local M = {}

M.DEFAULT_PATH = "build/libhost_floors.so"

-- The library at path (default DEFAULT_PATH) with hf_init(m, k, n) done (the GEMM floors'
-- shapes), or nil and why not.
function M.open(path, m, k, n)
  path = path or M.DEFAULT_PATH
  local ok, lib = pcall(ffi.load, path)
  if not ok then return nil, "cannot load " .. path .. " (" .. tostring(lib) .. ")" end
  if lib.hf_init(m, k, n) ~= 0 then return nil, "hf_init failed (the reason is printed above)" end
  return lib
end

-- Floor name -> floor id, for every floor of lib's hf_names; with available_only, only those
-- hf_init could set up (a GEMM the heuristic refused is not).
function M.ids(lib, available_only)
  local ids, i = {}, 0
  while lib.hf_names[i] ~= nil do
    if not available_only or lib.hf_available(i) == 1 then ids[ffi.string(lib.hf_names[i])] = i end
    i = i + 1
  end
  return ids
end

return M
