#!/usr/bin/env bash
# Builds test_cuda_ops with nvcc and cc alone, for a GPU machine that has the CUDA toolkit but
# not the project's other dependencies (the full CMake configure needs them).
#   tests/gpu/build_standalone.sh [OUT_DIR] [ARCH]     (defaults: build-gpu, 90a)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-gpu}
arch=${2:-90a}
mkdir -p "$out/obj"
for f in kernels/cuda/*.cu; do
  nvcc -std=c++17 -O3 -I. -gencode "arch=compute_${arch},code=sm_${arch}" -Xcompiler -Wall,-fmacro-prefix-map=$PWD/= \
    -c "$f" -o "$out/obj/cu_$(basename "$f" .cu).o" &
done
for f in kernels/cpu/*.c common/status.c common/threads.c common/alloc.c common/log.c tests/gpu/test_cuda_ops.c; do
  cc -std=c11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_POSIX_C_SOURCE=200809L \
    -D_DEFAULT_SOURCE -I. -I"$(dirname "$(command -v nvcc)")/../include" \
    -c "$f" -o "$out/obj/c_$(basename "$f" .c).o" &
done
wait
nvcc -o "$out/test_cuda_ops" "$out"/obj/*.o -lcublasLt -lpthread -lm
echo "built $out/test_cuda_ops"
