--[[
  slice(list, first, last) -> list
  The items first..last of a list (last: to its end when nil), as a new list: how a script names the variable
  tail of its KEYS or ARGV (a script indexes KEYS and ARGV only where it binds them to names, at its top).
]]
local function slice(list, first, last)
  local out = {}
  for i = first, last or #list do out[#out + 1] = list[i] end
  return out
end
