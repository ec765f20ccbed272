#!/usr/bin/env bash
# Nsight Compute over chosen kernels of one bench_layer_cuda case, at the GPU's own clocks.
# Pitfall handled here: a case's first layer run launches the expert GEMMs with the safe bound
# on an expert's rows (every token: hundreds of thousands of empty blocks), so the launches of
# that run are skipped (--skip, counted over the kernels matched) and the timed ones profiled.
#
#   bench/ncu_layer.sh BENCH_BINARY OUT_FILE [--case prefill] [--kernels REGEX] [--skip 4]
#                      [--count 2] [--timeout 300] [--sass CSV] [-- NCU_ARGS...]
# BENCH_BINARY: bench_layer_cuda (as built by bench/run_layer_bench.sh); REGEX matches kernel
# names (default: the FP4 expert GEMMs). NCU (default: ncu on PATH, else the CUDA toolkit's).
# Environment switches (BT_CUDA_*) pass through to the benchmark. --sass CSV also samples where
# the warps stall, instruction by instruction, and writes the SASS with each instruction's
# counts (executions, stall samples by reason) to CSV (the report beside it, CSV.ncu-rep);
# bench/ncu_sass_summary.py CSV sums it up (mix, stall reasons, hottest instructions).
set -euo pipefail
usage="usage: ncu_layer.sh BENCH_BINARY OUT_FILE [--case C] [--kernels REGEX] [--skip N] [--count N] [--timeout S] [--sass CSV] [-- NCU_ARGS...]"
bin=${1:?$usage}
out=${2:?$usage}
shift 2
case_=prefill
kernels='gemm_fp4_wgrs|gemm_rows'
skip=4
count=2
limit=300
sass=
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --case) case_=$2; shift 2 ;;
    --kernels) kernels=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --sass) sass=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "ncu_layer.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "ncu_layer.sh: $bin is not an executable file" >&2; exit 2; }
ncu=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)}
[ -n "$ncu" ] || { echo "ncu_layer.sh: no ncu (set NCU)" >&2; exit 2; }
for n in "$skip" "$count" "$limit"; do
  case "$n" in '' | *[!0-9]*) echo "ncu_layer.sh: $n is not a count" >&2; exit 2 ;; esac
done
rep=()
[ -n "$sass" ] && rep=(--section SourceCounters -o "$sass" -f)
timeout "$limit" "$ncu" --clock-control none --kernel-name "regex:$kernels" \
  --launch-skip "$skip" --launch-count "$count" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats \
  "${rep[@]}" "${extra[@]}" "$bin" --cases "$case_" --reps 20 --warmup 1 >"$out" 2>&1
if [ -n "$sass" ]; then
  # (with -o the sections go to the report, not to stdout: print them from it)
  timeout 120 "$ncu" -i "$sass.ncu-rep" >>"$out" 2>&1
  timeout 120 "$ncu" -i "$sass.ncu-rep" --page source --csv --print-source sass >"$sass" 2>>"$out"
  echo "ncu_layer.sh: SASS with per-instruction counts in $sass"
fi
echo "ncu_layer.sh: $(grep -c '^  [a-z_].*(' "$out" || true) kernel launches profiled into $out"
