-- Runs the specs of spec/dist/ under mpirun (CPU backend, oversubscribed, as root when CI is):
-- one busted per rank writing TAP into its own file, then each test's result on every rank.
-- spec/dist_spec.lua turns each test into one spec of the main run, so busted's totals count
-- them. Skipped with the reason when this build has no MPI or mpirun is missing. Under
-- `make test-asan` the ranks inherit LUTRA_LIB and the ASan preload, so they run instrumented.
local lutra = require("lutra")
local M = {}

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  local ok, _, code = p:close()
  return out, ok == true or ok == 0, code
end
M.sh = sh

function M.available()
  if not lutra.dist.available() then return false, "liblutra was built without MPI" end
  local _, ok = sh("command -v mpirun")
  if not ok then return false, "mpirun is not installed (apt-get install openmpi-bin)" end
  return true
end

local function mpirun_prefix(np, extra, limit_s)
  -- containers often forbid the cross-process memory attach (CMA) Open MPI's shared-memory
  -- transport tries first: copy through the shared segment instead
  return string.format("timeout %d mpirun --allow-run-as-root --oversubscribe "
                       .. "--mca btl_vader_single_copy_mechanism none %s -np %d "
                       .. "-x LUA_PATH -x LUTRA_LIB ", limit_s or 900, extra or "", np)
end
M.mpirun_prefix = mpirun_prefix

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- { np, out (mpirun's), ok, ranks = { [r] = { results = {name = {ok, detail}}, names, text } } }
function M.run_busted(np)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir) == 0 or true)
  local luajit = os.getenv("LUAJIT") or "luajit"
  local cmd = mpirun_prefix(np) .. "-x LUTRA_DIST_TIMEOUT=120 sh -c '" .. "exec \"$0\" /usr/bin/busted "
      .. "--lpath=\"lua/?.lua;lua/?/init.lua\" -o TAP --pattern=_dist spec/dist > " .. dir
      .. "/rank.$OMPI_COMM_WORLD_RANK 2>&1' " .. luajit
  local out, ok = sh(cmd)
  local run = { np = np, out = out, ok = ok, ranks = {} }
  for r = 0, np - 1 do
    local text = read(dir .. "/rank." .. r) or ""
    local rr = { results = {}, names = {}, text = text }
    local last
    for line in text:gmatch("[^\n]*") do
      local name = line:match("^ok %d+ %- (.*)$")
      local bad = line:match("^not ok %d+ %- (.*)$")
      if name or bad then
        last = name or bad
        rr.names[#rr.names + 1] = last
        rr.results[last] = { ok = name ~= nil, detail = "" }
      elseif last and line:match("^#") then
        rr.results[last].detail = rr.results[last].detail .. line .. "\n"
      end
    end
    run.ranks[r] = rr
    os.remove(dir .. "/rank." .. r)
  end
  os.remove(dir)
  return run
end

return M
