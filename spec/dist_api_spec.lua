-- The dist API in one process without MPI initialized (the collectives themselves run under
-- mpirun: spec/dist_spec.lua): what is refused, and how it is named.
local lutra = require("lutra")

describe("dist API (one process)", function()
  it("reports whether this build has MPI", function()
    assert.is_boolean(lutra.dist.available())
  end)

  it("world before init is refused naming the call", function()
    local ok, err = pcall(lutra.dist.world)
    assert.is_false(ok)
    if lutra.dist.available() then
      assert.matches("lutra_dist_world: call lutra_dist_init first", err)
    else
      assert.matches("lutra_dist_world: built without MPI", err)
    end
  end)

  it("the C entry points refuse NULL and non-groups", function()
    local C, ffi = lutra.C, lutra.ffi
    local int = ffi.new("int[1]")
    assert.are_not.equal(0, C.lutra_group_rank(nil, int))
    assert.matches("lutra_group_rank: ", ffi.string(C.lutra_last_error()))
    assert.are_not.equal(0, C.lutra_group_size(nil, int))
    assert.are_not.equal(0, C.lutra_group_split(nil, 0, 0, ffi.new("lutra_group*[1]")))
    assert.are_not.equal(0, C.lutra_group_all_reduce(nil, lutra.tensor({ 1 }, "f32"), 0))
    assert.matches("lutra_group_all_reduce: ", ffi.string(C.lutra_last_error()))
    -- a recipe is not a group
    local r = lutra.recipe.delayed()
    assert.are_not.equal(0, C.lutra_group_size(ffi.cast("lutra_group *", r), int))
    assert.matches(lutra.dist.available() and "lutra_group_size: group is not a group"
                   or "lutra_group_size: built without MPI", ffi.string(C.lutra_last_error()))
    assert.are.equal(0, C.lutra_group_unref(nil))
  end)

  it("init refuses a NaN timeout and options it does not know", function()
    assert.has_error(function() lutra.dist.init({ timeout = 0 / 0 }) end)
    assert.has_error(function() lutra.dist.init({ bogus = 1 }) end)
  end)

  it("autocast refuses a group argument that is not a group", function()
    local ok, err = pcall(lutra.autocast, { recipe = lutra.recipe.delayed(), group = 3 })
    assert.is_false(ok)
    assert.matches("group must be a group", err)
  end)
end)
