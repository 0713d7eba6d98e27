#!/usr/bin/env bash
# bench/gpu_variant.sh NAME "DEFINES" — a measurement build of ctrain beside the default one:
# kernels/cuda/decode.cu compiled again with extra preprocessor defines (e.g. -DCT_DECODE_TIMELINE,
# -DCT_GV_DOWN_MINB=4) by build-gpu's own command line, put into a copy of libctrain_core.a and
# linked as build-gpu/ctrain-NAME. build-gpu and its sources stay as they are, so several variants
# can compile at once (one core each) while `ninja -C build-gpu` builds the default; pack them for a device call with
#     EXTRA="build-gpu/ctrain-tl=build-gpu/ctrain-tl" bench/gpu_pack.sh ctrain
# Needs a configured build-gpu (bench/gpu_pack.sh makes one) whose libctrain_core.a is current.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bench/gpu_variant.sh NAME \"-DX -DY=1\"" >&2; exit 2; }
name=$1 defs=$2
case $name in
  launch | "" | */*) echo "gpu_variant.sh: '$name' would clash with a target of the build" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../build-gpu"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
obj=libctrain_core.a.p/kernels_cuda_decode.cu.o
cmd=$(ninja -t commands ctrain | grep -F -- "-o $obj -c ../kernels/cuda/decode.cu" | tail -1)
[ -n "$cmd" ] || { echo "gpu_variant.sh: no compile command for decode.cu in build-gpu" >&2; exit 1; }
cmd=${cmd/-MD -MT $obj -MF $obj.d/}
cmd=${cmd/-o $obj/-o $work/kernels_cuda_decode.cu.o}
eval "$cmd $defs"
# the default's archive (one variant at a time brings it up to date; wait for a ninja already
# building in build-gpu rather than race it)
while pgrep -f "ninja -C [^ ]*build-gpu" > /dev/null; do sleep 5; done
flock .gpu_variant.lock ninja libctrain_core.a > /dev/null
cp libctrain_core.a "$work/lib.a"
(cd "$work" && ar r lib.a kernels_cuda_decode.cu.o)
link=$(ninja -t commands ctrain | tail -1)
link=${link/-o ctrain /-o ctrain-$name }
link=${link/ libctrain_core.a / $work/lib.a }
eval "$link"
echo "build-gpu/ctrain-$name ($defs)"
