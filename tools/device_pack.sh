#!/usr/bin/env bash
# Prepare one GPU call from the development VM: CUDA libraries built here for sm_90 (this tree's
# HEAD and any other revisions, each in a git worktree under build/device-pack/), the device
# kit without what a run does not need, and what the benches load beside the library.
#   bash tools/device_pack.sh [REV...]         (from the repository root; HEAD's commit, not
#                                             uncommitted changes; REV: e.g. a base to
#                                             time a change against; HEAD is always built)
# Writes (all ignored by git; carry what the call needs):
#   .dk/                        the device kit (../shared/tools/device-kit) minus its -dev
#                               packages, plus Open MPI's runtime libraries: a library built
#                               here links libmpi.so.40, which the GPU machine's image lacks
#   build/device-pack/NAME.tar.xz  NAME/liblutra.so (debug sections stripped): HEAD as "head",
#                               each REV by its short hash; unpack with tar -xJf into a folder
#                               and point LUTRA_LIB (or LD_LIBRARY_PATH, with a liblutra.so.0
#                               link) at it
#   build/device-pack/libhost_floors.so, build/device-pack/norm_throughput
#   lua/lutra/cdef.lua          (the generated FFI declarations the Lua front loads)
# One call carries at most 64 MiB with the tracked tree (~5 MiB): the kit is ~11 MiB and a
# library ~22 MiB, so two libraries fit beside the kit, or one beside TE's pack
# (tools/te_pack/, 28 MiB). Builds take ~25 minutes for the first library on 2 cores; a REV
# reuses HEAD's objects where its sources are the same (only the files that differ compile).
set -euo pipefail
ROOT=$PWD
PACK=build/device-pack
ARCHS="-gencode arch=compute_90,code=sm_90"
JOBS=${JOBS:-$(nproc)}
mkdir -p "$PACK"
step() { echo "=== [device_pack] $*"; }

build_rev() { # REV NAME: a worktree at REV, its library built and packed as NAME
  # REV resolved here: inside the worktree, "HEAD" would name the worktree's own last checkout
  local rev name=$2 wt=$ROOT/$PACK/wt-$2
  rev=$(git -C "$ROOT" rev-parse --verify "$1^{commit}")
  [ -d "$wt" ] || git worktree add --detach "$wt" "$rev" > /dev/null
  git -C "$wt" checkout -q --detach "$rev"
  if [ "$name" != head ] && [ -d "$ROOT/$PACK/wt-head/build" ] && [ ! -d "$wt/build" ]; then
    # HEAD's objects, and sources dated before them, so that make compiles only what differs
    (cd "$wt" && find . -path ./.git -prune -o -type f -exec touch -h -d '2000-01-01' {} +)
    cp -a "$ROOT/$PACK/wt-head/build" "$wt/"
    for f in $(git -C "$wt" diff --name-only HEAD "$(git -C "$ROOT" rev-parse HEAD)"); do
      [ -f "$wt/$f" ] && touch "$wt/$f"
    done
  fi
  step "building $name ($rev) in $wt"
  (cd "$wt" && nice make -j"$JOBS" CUDA=1 CUDA_ARCHS="$ARCHS" all > "$ROOT/$PACK/build-$name.log" 2>&1) ||
    { tail -20 "$PACK/build-$name.log"; exit 1; }
  local tmp
  tmp=$(mktemp -d)
  mkdir -p "$tmp/$name"
  strip --strip-debug -o "$tmp/$name/liblutra.so" "$wt/liblutra.so"
  tar -C "$tmp" -cf - "$name" | xz -T"$JOBS" -6 > "$PACK/$name.tar.xz"
  rm -rf "$tmp"
}

build_rev HEAD head
cp "$PACK/wt-head/lua/lutra/cdef.lua" lua/lutra/cdef.lua
for rev in "$@"; do
  build_rev "$rev" "$(git rev-parse --short "$rev")"
done

step "bench helpers"
nvcc -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared bench/host_floors.cu \
  bench/host_replay.cu -o "$PACK/libhost_floors.so" -lcublasLt -lcuda
gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -I/usr/local/cuda/include \
  bench/norm_throughput.c -o "$PACK/norm_throughput" -L"$PACK/wt-head" -llutra \
  -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,/usr/local/cuda/lib64

step "device kit"
KIT=${DEVICE_KIT:-../shared/tools/device-kit}
rm -rf .devkit .dk
DEVKIT_EXTRA="lua-argparse libprotobuf-c1 libopenmpi3 libhwloc15 libevent-core-2.1-7 \
libevent-pthreads-2.1-7 libudev1 ${DEVKIT_EXTRA:-}" "$KIT" > "$PACK/device-kit.log" 2>&1
mv .devkit .dk
sed -i 's#\.devkit#.dk#g' .dk/enter.sh
rm -f .dk/libopenblas-dev* .dk/libopenblas-pthread-dev* .dk/libluajit-5.1-dev*
# Open MPI's package without its plugins, Fortran/C++/Java bindings and OpenSHMEM: only what
# loading libmpi.so.40 needs (a run that starts MPI would need the plugins too)
tmp=$(mktemp -d)
dpkg-deb -R .dk/libopenmpi3_*.deb "$tmp/d"
(cd "$tmp/d/usr/lib/x86_64-linux-gnu" && rm -rf openmpi libmpi_* liboshmem*)
rm -rf "$tmp/d/usr/share" "$tmp/d/DEBIAN/"{md5sums,triggers,shlibs,symbols}
sed -i '/^Depends/d;/^Recommends/d;/^Suggests/d' "$tmp/d/DEBIAN/control"
rm .dk/libopenmpi3_*.deb
dpkg-deb -Zxz -b "$tmp/d" .dk/libopenmpi3-runtime.deb > /dev/null
rm -rf "$tmp"
# on the machine: the kit's Debian libudev only where the image has none
cat >> .dk/enter.sh << 'EOF'
ldconfig -p | grep -q 'libudev.so.1 ' && rm -f $_k/usr/lib/$_a/libudev.so.1* $_k/lib/$_a/libudev.so.1*
true
EOF

step "done: $(du -sh .dk | cut -f1) kit; $(ls "$PACK"/*.tar.xz | tr '\n' ' ')"
