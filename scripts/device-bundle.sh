#!/usr/bin/env bash
# Packs what a GPU machine without the project's Debian libraries needs to run the tests and
# services built here: stripped binaries, the shared libraries they link (except the C
# runtime and CUDA, which that machine has) and UCX's transport modules. Optionally the
# golden fixtures. For the device tool's `carry` (the folder is git-ignored).
#   scripts/device-bundle.sh BUILD_DIR OUT_DIR [--golden] [BINARY...]
#   there: LD_LIBRARY_PATH=OUT_DIR/lib UCX_MODULE_DIR=OUT_DIR/lib/ucx OUT_DIR/bin/...
set -euo pipefail
build=$1 out=$2
shift 2
golden=0
if [ "${1:-}" = --golden ]; then golden=1; shift; fi
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(baton baton-router baton-prefill baton-decode baton-gateway)
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libnccl)'
for b in "${bins[@]}"; do
  strip -o "$out/bin/$b" "$build/bin/$b"
  ldd "$build/bin/$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -L "$path" "$out/lib/$name"; fi
  done
done
ucx_modules=$(dirname "$(ldconfig -p | awk '/libucs.so.0 / {print $NF; exit}')")/ucx
if [ -d "$ucx_modules" ] && ls "$out/lib" | grep -q libucs; then
  mkdir -p "$out/lib/ucx"
  cp -L "$ucx_modules"/libuct_cma.so* "$ucx_modules"/libucm_* "$out/lib/ucx/" 2>/dev/null || true
fi
if [ $golden = 1 ]; then
  cp -r "$(dirname "$0")/../../shared/golden" "$out/golden"
fi
du -sh "$out"
