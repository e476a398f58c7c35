-- The values of every parameter of a module, flattened into one Lua array in parameter order,
-- for specs that compare whole models. Not a spec itself (no _spec in its name).
return function(m)
  local out = {}
  for _, p in ipairs(m:parameters()) do
    for _, v in ipairs(p.value:to_table()) do out[#out + 1] = v end
  end
  return out
end
