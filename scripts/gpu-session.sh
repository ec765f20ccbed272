#!/usr/bin/env bash
# A GPU session's device calls, prepared here and run there. The device tool lends a few calls
# a session (sometimes one), each at most 10 minutes: each call should bring back all it can.
#
# Here (builds, then packs .dev/cb/c.tgz for the tool's carry [".dev/cb"], under its 64 MiB):
#   scripts/gpu-session.sh pack [--rev REV]... [--cubin FILE.cu]...
#     build-cuda-sm90a (Release, sm_90a only: the device's code, half the fatbins that five
#     binaries each carry) and the layer bench; the tests, services, golden fixtures and the
#     layer bench in one bundle; with --rev, REV's layer bench too (built in a worktree), as
#     bench_layer_cuda_REV, for same-run A/B; with --cubin, FILE's sm_90a cubin for its SASS.
# There (the command of one device call; results in $OUT/r.tgz):
#   bash scripts/gpu-session.sh run STEP... [--ab CONFIG]...
#     sass   the SASS of every packed cubin
#     check  tests/gpu/run_all.sh (operators, fallbacks, model, two clusters)
#     bench  the layer against its floors and PyTorch (bench/run_layer_bench.sh)
#     paths  bench/bench_read_paths: DRAM read paths at one product's size and at 1 GiB
#     chain  bench/bench_chain: the decode layer's steps as PDL kernels on two streams and as
#            one persistent kernel
#     trace  the layer's graphs as they run, each kernel's start and length (CUPTI)
#     prof   Nsight Compute over the prefill's FP4 expert GEMM (gemm_fp4_wgrs): its sections and
#            its SASS with each instruction's executions and stall samples (bench/ncu_layer.sh)
#     ab     bench/ab_layer.py, two rounds: the packed bench, each bench_layer_cuda_REV, and
#            each --ab CONFIG (a bench binary's name in the bundle, with :NAME=VALUE,...
#            environment switches, e.g. bench_layer_cuda:BT_CUDA_ROWS_KS=4)
#   check + bench + sass fit one call (~7 min); ab with five configurations takes another.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bundle=.dev/c
what=${1:-}
shift || true

pack() {
  local revs=() cus=()
  while [ $# -gt 0 ]; do
    case $1 in
      --rev) revs+=("$2"); shift 2 ;;
      --cubin) cus+=("$2"); shift 2 ;;
      *) echo "gpu-session.sh pack: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  set -e
  [ -d build-cuda-sm90a ] || cmake -S . -B build-cuda-sm90a -DBT_CUDA=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
  cmake --build build-cuda-sm90a -j2 > /dev/null
  JOBS=2 bash bench/run_layer_bench.sh --build-only | tail -1
  rm -rf "$bundle" && mkdir -p .dev/cb
  scripts/device-bundle.sh build-cuda-sm90a "$bundle" --golden test_cuda_ops test_model_cuda baton \
    baton-router baton-prefill baton-decode baton-gateway > /dev/null
  mkdir -p "$bundle/bench" "$bundle/cubin"
  # CUPTI for bench_layer_cuda --trace (the toolkit's, beside its cudart)
  local cupti
  cupti=$(ls "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")"/../lib*/libcupti.so.* \
    2>/dev/null | head -1)
  [ -n "$cupti" ] && cp -L "$cupti" "$bundle/lib/"
  strip -o "$bundle/bench/bench_layer_cuda" build-gpu-bench/bench_layer_cuda
  for rev in "${revs[@]}"; do
    local wt short
    short=$(git rev-parse --short "$rev")
    wt=$(mktemp -d)/wt
    git worktree add -q "$wt" "$rev"
    (cd "$wt" && JOBS=2 bash bench/run_layer_bench.sh --build-only | tail -1)
    strip -o "$bundle/bench/bench_layer_cuda_$short" "$wt/build-gpu-bench/bench_layer_cuda"
    git worktree remove --force "$wt"
  done
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nvcc" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/bench_read_paths.cu \
    -o "$bundle/bench/bench_read_paths"
  "$nvcc" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/bench_chain.cu \
    -o "$bundle/bench/bench_chain"
  for cu in "${cus[@]}"; do
    "$nvcc" -cubin -O3 -std=c++17 -I. -gencode arch=compute_90a,code=sm_90a "$cu" \
      -o "$bundle/cubin/$(basename "$cu" .cu).cubin"
  done
  # The carry's 64 MiB hold the working tree (tracked and untracked files) beside the bundle, a
  # MiB kept spare; past that, the optional parts go (CUPTI for `trace`, bench_read_paths for
  # `paths`: trace then looks for the device toolkit's CUPTI, paths fails).
  local tree room
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
  room=$(((63 << 20) - tree))
  rm -f .dev/cb/*
  # (gzip -9: ~1 MiB under the default level, which left session 34's bundle 0.2 MiB too large)
  tar -C .dev -I 'gzip -9' -cf .dev/cb/c.tgz c
  if [ "$(stat -c %s .dev/cb/c.tgz)" -gt "$room" ]; then
    tar -C .dev -I 'gzip -9' -cf .dev/cb/c.tgz --exclude='c/lib/libcupti*' \
      --exclude='c/bench/bench_read_paths' c
    echo "left out CUPTI and bench_read_paths to fit (trace: the device toolkit's CUPTI if any; no paths)"
  fi
  local size
  size=$(stat -c %s .dev/cb/c.tgz)
  echo "packed .dev/cb/c.tgz: $((size >> 20)) MiB beside the tree's $((tree >> 20)) MiB (the carry" \
    "holds 64); benches: $(ls "$bundle/bench" | tr '\n' ' ')"
  [ "$size" -le "$room" ] || { echo "too large for the carry" >&2; exit 1; }
}

run() {
  local steps=() configs=()
  while [ $# -gt 0 ]; do
    case $1 in
      --ab) configs+=("$2"); shift 2 ;;
      sass | check | bench | ab | paths | chain | trace | prof) steps+=("$1"); shift ;;
      *) echo "gpu-session.sh run: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  local out=${OUT:?run where the device tool sets OUT} t0=$SECONDS
  local r=$out/r
  mkdir -p "$r"
  tar -C .dev -xzf .dev/cb/c.tgz
  export LD_LIBRARY_PATH=$PWD/$bundle/lib:/usr/local/cuda/lib64
  chmod +x "$bundle"/bench/* 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$r/gpu.txt" 2>&1
  git log -1 --format='%H %s' > "$r/commit.txt" 2>/dev/null || true
  for step in "${steps[@]}"; do
    echo "== $step (at $((SECONDS - t0)) s)"
    case $step in
      sass)
        for c in "$bundle"/cubin/*.cubin; do
          [ -f "$c" ] || continue
          cuobjdump -sass "$c" 2>&1 | gzip > "$r/$(basename "$c" .cubin).sass.gz"
        done ;;
      check)
        timeout 340 bash tests/gpu/run_all.sh "$bundle" "$r/gpu" | tee "$r/check.txt" ;;
      bench)
        timeout 200 bash bench/run_layer_bench.sh --no-build --out "$bundle/bench" --save "$r/layer" \
          > "$r/bench.txt" 2>&1
        tail -25 "$r/bench.txt" ;;
      paths)
        for mib in 40 1024; do
          timeout 150 "$bundle/bench/bench_read_paths" --mib $mib > "$r/read_paths-$mib.txt" 2>&1
          tail -12 "$r/read_paths-$mib.txt"
        done ;;
      chain)
        timeout 120 "$bundle/bench/bench_chain" --spin-us 0.5,2,4 --pf-kb 0,48,96 \
          > "$r/chain.txt" 2>&1
        cat "$r/chain.txt" ;;
      trace)
        timeout 240 "$bundle/bench/bench_layer_cuda" --reps 20 --trace "$r/trace" > "$r/trace.txt" 2>&1
        tail -8 "$r/trace.txt"
        for f in "$r"/trace/*.md; do grep -h "^span\|^###" "$f"; done ;;
      prof)
        # (the profile's 240 s and the report's two exports' 120 s each, within the outer bound)
        timeout 500 bash bench/ncu_layer.sh "$bundle/bench/bench_layer_cuda" "$r/ncu-wgrs.txt" \
          --kernels gemm_fp4_wgrs --count 1 --timeout 240 --sass "$r/ncu-wgrs-sass.csv"
        gzip -f "$r/ncu-wgrs-sass.csv"
        rm -f "$r/ncu-wgrs-sass.csv.ncu-rep"
        grep -E "Duration|Issue Slots Busy|Throughput" "$r/ncu-wgrs.txt" | head -12 ;;
      ab)
        local all=("$bundle/bench/bench_layer_cuda")
        for b in "$bundle"/bench/bench_layer_cuda_*; do [ -f "$b" ] && all+=("$b"); done
        for cfg in "${configs[@]}"; do all+=("$bundle/bench/$cfg"); done
        timeout 420 python3 bench/ab_layer.py "${all[@]}" --rounds 2 --log "$r/ab.log" > "$r/ab.txt" 2>&1
        cat "$r/ab.txt" ;;
    esac
  done
  echo "== done at $((SECONDS - t0)) s"
  (cd "$out" && tar czf r.tgz r && rm -rf r)
}

case $what in
  pack) pack "$@" ;;
  run) run "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
