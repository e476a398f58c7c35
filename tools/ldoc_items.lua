-- An LDoc filter (ldoc --all --filter ldoc_items.list, with tools/ on LUA_PATH) printing one line
-- per documented item, "file<TAB>module<TAB>name<TAB>local<TAB>summary" (local: "local" for an
-- item marked @local, else "public"), and one line per module, "file<TAB>module<TAB><TAB>module
-- <TAB>summary", for spec/doc_spec.lua's checks that every file of lua/lutra is in the reference
-- and every public function and method of the Lua front has a doc comment.
local M = {}

local function flat(s) return ((s or ""):gsub("%s+", " ")) end

function M.list(modules)
  for _, m in ipairs(modules) do
    local file = type(m.file) == "string" and m.file:match("lua/lutra/[%w_]+%.lua$") or ""
    io.write(file, "\t", m.name, "\t\tmodule\t", flat(m.summary), "\n")
    for _, item in ipairs(m.items) do
      local is_local = item.type == "lfunction" or (item.tags and item.tags["local"])
      io.write(file, "\t", m.name, "\t", item.name, "\t", is_local and "local" or "public", "\t",
               flat(item.summary), "\n")
    end
  end
end
return M
