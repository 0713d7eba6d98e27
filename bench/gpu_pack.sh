#!/usr/bin/env bash
# bench/gpu_pack.sh — builds the CUDA tree here and packs what a device call needs into
# .carry/pack.tar.xz: the named executables of build-gpu (default: ctrain and the decode / op
# tests) and the shared libraries the lent host lacks (../shared/gpu/bundle.sh). The device tool
# sends at most 64 MiB (the tracked tree included), so a pack of all of build-gpu does not
# travel; each executable is ~14 MB, ~4 MB after xz. EXTRA="path=name ..." adds other files
# under the names given (e.g. a baseline binary: EXTRA="/tmp/old/ctrain=build-gpu/ctrain-base").
# On the device, in the repository root:
#     tar -xJf .carry/pack.tar.xz && export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64
# and name .carry in the call's `carry`. Usage: bench/gpu_pack.sh [BIN ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(ctrain tests/test_decode_cuda tests/test_ops_cuda)
# the lent host has meson 1.12.1: a build directory made by another meson version does not load
# there, and its meson test would refuse it
[ -f build-gpu/build.ninja ] ||
  meson setup build-gpu -Dcuda=enabled -Dcuda-arch=90 -Dcpu_arch=x86-64-v3 -Dbuildtype=release
# An object that ninja holds no header dependencies for (compiled by hand, e.g. by an older
# variant script) is never rebuilt when a header changes: on 2026-12-06 such an ops_cuda.cu
# object kept the old ct_ops layout after kernels/ops.h gained a member, and every graph capture
# of the packed binaries called the wrong table entry. Such objects are removed, so they rebuild.
ninja -C build-gpu -t deps 2>/dev/null | sed -n 's/^\([^ ]*\.o\): #deps 0,.*/\1/p' | while read -r o; do
  echo "gpu_pack.sh: build-gpu/$o has no recorded dependencies: rebuilding it"
  rm -f "build-gpu/$o"
done
ninja -C build-gpu
for p in /build-gpu/ /.gpu/ /.carry/; do
  grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude
done
../shared/gpu/bundle.sh build-gpu .gpu > /dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu" .carry
for b in "${bins[@]}"; do
  [ -x "build-gpu/$b" ] || { echo "gpu_pack.sh: build-gpu/$b is not an executable of the build" >&2; exit 2; }
  mkdir -p "$stage/build-gpu/$(dirname "$b")"
  cp "build-gpu/$b" "$stage/build-gpu/$b"
done
for x in ${EXTRA:-}; do
  mkdir -p "$stage/$(dirname "${x#*=}")"
  cp "${x%%=*}" "$stage/${x#*=}"
done
cp -r .gpu "$stage/.gpu"
# one xz stream with a 64 MiB dictionary (-9, one thread; -T0 would cut it into blocks):
# ~20-25% smaller than -6 -T0 (session 47: ctrain, ctrain-tl, the decode test and .gpu 26 MB
# against 34; with three variants more 45 against 56, which then fit the 64 MiB a call sends),
# at ~1 min of one core
tar -C "$stage" -cf - . | xz -9 -T1 > .carry/pack.tar.xz
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
total=$((tree + $(du -cb .carry | tail -1 | cut -f1)))
echo "pack: $(du -h .carry/pack.tar.xz | cut -f1) (${bins[*]} ${EXTRA:-}); with the tracked tree $((total >> 20)) MiB of the 64 MiB a call sends"
[ $total -lt $((64 << 20)) ] || { echo "gpu_pack.sh: over the 64 MiB a device call sends: pack fewer executables" >&2; exit 1; }
