#!/bin/sh
# Prints lua/lutra/cdef.lua: the public header, preprocessed with LUTRA_CDEF so that only plain
# declarations remain (LuaJIT's FFI parser takes no preprocessor lines and no system headers).
set -e
cc=${1:-cc}
header=${2:-src/lutra.h}
echo "-- Generated from $header by tools/gen_cdef.sh. Do not edit."
echo "return [["
"$cc" -E -P -DLUTRA_CDEF -x c "$header" | sed -e '/^[[:space:]]*$/d'
echo "]]"
