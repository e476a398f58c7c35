-- An LDoc filter (ldoc --filter ldoc_items.list, with tools/ on LUA_PATH) printing one line per
-- documented item, "module<TAB>section<TAB>name<TAB>summary", for spec/doc_spec.lua's check
-- that every public function and method of the Lua front is in the reference.
local M = {}
function M.list(modules)
  for _, m in ipairs(modules) do
    for _, item in ipairs(m.items) do
      local summary = (item.summary or ""):gsub("%s+", " ")
      io.write(m.name, "\t", item.section or "", "\t", item.name, "\t", summary, "\n")
    end
  end
end
return M
