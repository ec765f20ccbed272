#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: dependencies, the normal build and its
# tests, the unit suite and the gateway test again under ASan+UBSan, and every libFuzzer
# target for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
fuzz_seconds=${BT_FUZZ_SECONDS:-20}

bash scripts/install-deps.sh
echo "== npm packages for the OpenAI client tests"
(cd tests/integration/openai && npm ci --no-audit --no-fund --loglevel=error)

echo "== build (RelWithDebInfo)"
configure=$(cmake -S . -B build -DBT_CUDA=AUTO)
grep -E "CUDA backend" <<<"$configure" || true
# with a CUDA compiler the kernels, the GPU model and the GPU test binaries are compiled and
# linked here too (for sm_90a and sm_121); the tests labelled gpu need a GPU and are skipped
cmake --build build -j"$jobs"
echo "== tests"
(cd build && ctest --output-on-failure -j"$jobs" -LE gpu)

echo "== unit tests, and the gateway test, under ASan+UBSan"
cmake -S . -B build-asan -DBT_CUDA=OFF -DBT_ASAN=ON -DBT_UBSAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ctest --output-on-failure -j"$jobs" -L unit -LE gpu)
# the gateway and the services behind it, on real sockets: a sanitizer report stops a service,
# and the test fails (UBSan stopped the router on a memcpy from NULL that no unit test reached)
(cd build-asan && ctest --output-on-failure -R '^test_gateway$')

echo "== fuzzers (${fuzz_seconds}s each)"
CC=clang cmake -S . -B build-fuzz -DBT_CUDA=OFF -DBT_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"$jobs"
shopt -s nullglob
fuzzers=(build-fuzz/bin/fuzz_*)
for f in "${fuzzers[@]}"; do
  name=$(basename "$f")
  # libFuzzer writes new inputs into its first directory: a scratch one, seeds after it
  mkdir -p "build-fuzz/corpus-$name"
  args=("build-fuzz/corpus-$name")
  for corpus in "tests/fuzz/corpus/${name#fuzz_}" "tests/fuzz/corpus/$name"; do
    [ -d "$corpus" ] && args+=("$corpus")
  done
  echo "-- $name"
  # an undefined-behaviour report fails the run (UBSan alone would print it and go on)
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -print_final_stats=0 "${args[@]}" \
    >"build-fuzz/$name.log" 2>&1 || { tail -40 "build-fuzz/$name.log"; exit 1; }
done
echo "fuzz: ${#fuzzers[@]} targets clean"
