#!/usr/bin/env bash
# Every GPU check in one call, for a GPU machine with a bundle made by scripts/device-bundle.sh
# (with --golden and the binaries test_cuda_ops test_model_cuda baton baton-router
# baton-prefill baton-decode baton-gateway): the operators against the CPU reference, the model
# against the golden fixtures (graphs, batch invariance, TP on one GPU), and the services'
# greedy ids against `baton generate` (auto TP 1, float32 TP 2, each again decoding
# speculatively with the demo model's DSpark stages). The operators whose Hopper
# kernels have another kernel for other GPUs (or for too little shared memory) run again with
# those switched off, so the kernels a GB10 takes are checked on the H200 too, and the FP4 expert
# GEMM's other forms, the few-row GEMMs' other weight loads and the FP8 products split over K
# (switches for comparisons) again. Each step is bounded in time;
# logs go to OUT_DIR, one summary line per step to stdout; the exit status is the number of
# steps that failed.
#   tests/gpu/run_all.sh BUNDLE_DIR OUT_DIR [--perf] [--only NAME]
set -uo pipefail
bundle=${1:?usage: run_all.sh BUNDLE_DIR OUT_DIR [--perf] [--only NAME]}
out=${2:?usage: run_all.sh BUNDLE_DIR OUT_DIR [--perf] [--only NAME]}
shift 2
perf= only=
while [ $# -gt 0 ]; do
  case $1 in
    --perf) perf=--perf; shift ;;
    --only) only=$2; shift 2 ;;
    *) echo "run_all.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "$bundle" && pwd)
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$bundle/lib/ucx"
[ -d "$bundle/golden" ] && export BT_GOLDEN_DIR="$bundle/golden"
failed=0
step() { # name seconds command...
  local name=$1 secs=$2
  shift 2
  if [ -n "$only" ] && [ "$only" != "$name" ]; then return; fi
  local t0=$SECONDS
  timeout "$secs" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "cases passed|checks,|identical|^FAIL" "$out/$name.log" | tail -1)
  printf '%-22s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$last"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}
step test_cuda_ops 300 "$bundle/bin/test_cuda_ops" $perf
step test_cuda_ops_fallbacks 300 env BT_CUDA_FLASHWG=0 BT_CUDA_IXWG=0 BT_CUDA_WGRS=0 BT_CUDA_HCTC=0 \
  "$bundle/bin/test_cuda_ops" --only "attention_flash,attention_tc,attention_tc_ws,attention_tc_batch,\
index_scores,index_scores_sets,index_scores_tc,index_sets_tc,gemm_fp4_grouped,gemm_fp4_listed,\
hc_mix,hc_mix_ws,hc_mix_collapse"
# gemm_fp4_wgrs' other form: the 4-stage pipeline
step test_cuda_ops_wgrs4st 120 env BT_CUDA_WGRS_STAGES=4 \
  "$bundle/bin/test_cuda_ops" --only "gemm_fp4_grouped,gemm_fp4_listed,gemm_fp4_swiglu"
# gemm_rows' weight loads with the other cache hints (the defaults: FP8 2, FP4 1 or 2 by the
# experts listed; the switches are for comparisons)
step test_cuda_ops_rows_lh0 120 env BT_CUDA_ROWS_LH=0 BT_CUDA_FP4_LH=0 \
  "$bundle/bin/test_cuda_ops" --only "gemm_fp8,gemm_fp8_batched,gemm_fp4_grouped,gemm_fp4_listed"
step test_cuda_ops_rows_lh1 120 env BT_CUDA_ROWS_LH=1 BT_CUDA_FP4_LH=1 \
  "$bundle/bin/test_cuda_ops" --only "gemm_fp8,gemm_fp8_batched,gemm_fp4_grouped,gemm_fp4_listed"
# the FP8 products' K slices over a cluster (off by default since session 37; bf16 keeps them)
step test_cuda_ops_fp8_ksplit 120 env BT_CUDA_FP8_KSPLIT_MAX=8 \
  "$bundle/bin/test_cuda_ops" --only "gemm_fp8,gemm_fp8_batched"
step test_model_cuda 300 "$bundle/bin/test_model_cuda"
step cluster_auto_tp1 200 bash "$here/cluster_cuda.sh" "$bundle/bin"
step cluster_auto_tp1_dspark 200 bash "$here/cluster_cuda.sh" "$bundle/bin" --dspark
step cluster_f32_tp2 200 bash "$here/cluster_cuda.sh" "$bundle/bin" --dtype float32 --tp 2
step cluster_f32_tp2_dspark 200 bash "$here/cluster_cuda.sh" "$bundle/bin" --dtype float32 --tp 2 --dspark
step cluster_auto_tp1_aq 200 bash "$here/cluster_cuda.sh" "$bundle/bin" --activation-quant fp8
exit $failed
