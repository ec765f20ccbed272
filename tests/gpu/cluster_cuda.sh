#!/usr/bin/env bash
# The services on a GPU: `baton up --device cuda` (router, a prefill and a decode group, the
# gateway) must give, for every prompt, the greedy ids `baton generate --device cuda` gives,
# one request at a time and eight at once (decode batches them), and again for prompts whose
# beginning the prefill group's prefix cache holds (restored into a device slot). Needs a GPU;
# run by hand or on the device machine:
#   tests/gpu/cluster_cuda.sh BIN_DIR [--device cuda|cpu] [--dtype auto|float32|bfloat16] [--tp N]
#                             [--dspark] [--activation-quant fp8]
# With --dspark the cluster decodes speculatively (--speculative-algorithm DSPARK, the demo
# model's draft stages); the reference stays plain `baton generate`, whose greedy ids it must give.
# With --tp N both groups are N ranks (processes) on the same GPU; the reference stays TP 1,
# so use --dtype float32 there (sharded projections are dequantized under TP).
# --activation-quant fp8 goes to the cluster and to every `baton generate` alike.
set -uo pipefail
bin=${1:?usage: cluster_cuda.sh BIN_DIR [--device cuda|cpu] [--dtype D] [--tp N]}
shift
device=cuda dtype=auto tp=1 spec=() aq=()
while [ $# -gt 0 ]; do
  case $1 in
    --dspark) spec=(--speculative-algorithm DSPARK); shift ;;
    --device) device=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --activation-quant) aq=(--activation-quant "$2"); shift 2 ;;
    *) echo "cluster_cuda.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
port=$((20000 + RANDOM % 20000)) router=$((port + 1))
"$bin/baton" up --device "$device" --dtype "$dtype" "${aq[@]}" --tp "$tp" --port "$port" --router-port "$router" \
  --ucx-tls tcp --max-new-tokens 64 "${spec[@]}" >"$work/up.log" 2>&1 &
up=$!
cleanup() { kill -TERM "$up" 2>/dev/null; wait "$up" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
keep_log() { cp "$work/up.log" /tmp/cluster_cuda_up.log; }
ready=0
for _ in $(seq 1 120); do  # bounded: 60 s for the cluster to answer
  if "$bin/baton" complete --router "127.0.0.1:$router" --input-ids 1 --max-new-tokens 1 \
       --timeout 5 >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.5
done
if [ $ready = 0 ]; then
  echo "FAIL the cluster did not answer within 60 s"
  keep_log
  tail -20 "$work/up.log"
  exit 1
fi
prompts=("1,2,3,4,5,6,7,8,9" "42" "7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7"
         "100,200,30,250,150,50,10,20,30,40,50,60,70,80,90,99,98,97,96,95,94,93,92,91,90,89,88,87,86,85,84,83,82,81,80,79,78,77,76,75,74,73,72,71,70"
         "5,4,3,2,1" "11,22,33,44,55,66" "250,251,252,253,254,255,256,257,258,259,260" "3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,2,7,9,5")
fail=0
for i in "${!prompts[@]}"; do
  "$bin/baton" generate --device "$device" --dtype "$dtype" "${aq[@]}" --input-ids "${prompts[$i]}" --max-new-tokens 48 \
    --temperature 0 --ignore-eos 2>/dev/null | tail -1 >"$work/ref.$i"
done
check() {  # $1: label
  for i in "${!prompts[@]}"; do
    # two empty outputs (both sides failing) must not pass as equal
    if ! grep -qE '^[0-9]+(,[0-9]+)*$' "$work/ref.$i"; then
      echo "FAIL $1 prompt $i: baton generate gave no ids"
      fail=1
    elif ! cmp -s "$work/ref.$i" "$work/got.$i"; then
      echo "FAIL $1 prompt $i: generate $(cat "$work/ref.$i") vs cluster $(cat "$work/got.$i")"
      grep -a "baton complete\|finish" "$work/err.$i" | head -3
      fail=1
    fi
  done
}
for i in "${!prompts[@]}"; do
  "$bin/baton" complete --router "127.0.0.1:$router" --input-ids "${prompts[$i]}" --max-new-tokens 48 \
    --temperature 0 --ignore-eos --timeout 60 2>"$work/err.$i" | tail -1 >"$work/got.$i"
done
check "one at a time"
for i in "${!prompts[@]}"; do
  "$bin/baton" complete --router "127.0.0.1:$router" --input-ids "${prompts[$i]}" --max-new-tokens 48 \
    --temperature 0 --ignore-eos --timeout 60 2>"$work/err.$i" | tail -1 >"$work/got.$i" &
done
wait $(jobs -p | grep -v "^$up$") 2>/dev/null
check "eight at once"
# The prefix cache on the device: a 300-token prompt, then again (its first 256 tokens are cached
# at the first run's chunk ends), and a prompt sharing its first 280 tokens (the same 256 cached).
# The prefill group ran the first prompt as 256 + 44 tokens and runs the others as their tails
# after the restored 256: the reference prefills in the same 256-token pieces, since FP8/FP4
# products of other row counts round differently (a whole 320-token prompt at once parted from
# the cached run's greedy ids after 15 tokens under --dtype auto on an H100).
long=$(seq 1 300 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37) % 251 + 3}')
branch=$(echo "$long" | cut -d, -f1-280),$(seq 1 40 | paste -sd,)
want_cached=(0 256 256)
for k in 0 1 2; do
  p=$long
  [ $k = 2 ] && p=$branch
  "$bin/baton" generate --device "$device" --dtype "$dtype" "${aq[@]}" --input-ids "$p" --max-new-tokens 24 \
    --chunked-prefill-size 256 --temperature 0 --ignore-eos 2>/dev/null | tail -1 >"$work/ref.c$k"
  "$bin/baton" complete --router "127.0.0.1:$router" --input-ids "$p" --max-new-tokens 24 \
    --temperature 0 --ignore-eos --timeout 60 2>"$work/err.c$k" | tail -1 >"$work/got.c$k"
  cached=$(grep -o '([0-9]* cached)' "$work/err.c$k" | tr -dc 0-9)
  if ! grep -qE '^[0-9]+(,[0-9]+)*$' "$work/ref.c$k" || ! cmp -s "$work/ref.c$k" "$work/got.c$k"; then
    echo "FAIL prefix cache request $k: generate $(cat "$work/ref.c$k") vs cluster $(cat "$work/got.c$k")"
    fail=1
  fi
  if [ "$cached" != "${want_cached[$k]}" ]; then
    echo "FAIL prefix cache request $k: ${cached:-no} cached tokens, want ${want_cached[$k]}"
    fail=1
  fi
done
# A sampled request (one at a time): the same seed gives `baton generate`'s tokens (drawn as the
# decode group draws them: on the GPU, or through speculative steps with --dspark).
sampling=(--temperature 0.8 --top-p 0.95 --seed 11 --max-new-tokens 24 --ignore-eos)
"$bin/baton" generate --device "$device" --dtype "$dtype" "${aq[@]}" --input-ids "${prompts[3]}" "${sampling[@]}" \
  "${spec[@]}" 2>/dev/null | tail -1 >"$work/ref.s"
"$bin/baton" complete --router "127.0.0.1:$router" --input-ids "${prompts[3]}" "${sampling[@]}" \
  --timeout 60 2>"$work/err.s" | tail -1 >"$work/got.s"
if ! grep -qE '^[0-9]+(,[0-9]+){23}$' "$work/ref.s" || ! cmp -s "$work/ref.s" "$work/got.s"; then
  echo "FAIL sampled request: generate $(cat "$work/ref.s") vs cluster $(cat "$work/got.s")"
  fail=1
fi
grep -h "model on GPU\|KV cache for" "$work/up.log" | head -4
proposed=
if [ ${#spec[@]} -gt 0 ]; then
  # the decode group verified proposals (its metrics), else the rounds above proved nothing new
  maddr=$(grep -o '/metrics on [0-9.]*:[0-9]*' "$work/up.log" | head -1 | awk '{print $3}')
  proposed=$(LD_LIBRARY_PATH= curl -s --max-time 5 "http://$maddr/metrics" | awk '/^baton_decode_spec_proposed_total/ {print int($2)}')
  if [ -z "$proposed" ] || [ "$proposed" -le 0 ]; then
    echo "FAIL the decode group verified no proposals (metrics at ${maddr:-?}: ${proposed:-none})"
    fail=1
  fi
fi
if [ $fail != 0 ]; then keep_log; echo "--- baton up log (tail)"; tail -20 "$work/up.log"; fi
if [ $fail = 0 ]; then echo "cluster on --device $device --dtype $dtype --tp $tp${spec[*]:+ ${spec[*]}}${aq[*]:+ ${aq[*]}}: ${#prompts[@]} prompts x 2 rounds, greedy ids identical to baton generate --device $device --dtype $dtype; prefix cache hits of 256 tokens twice, ids identical; a sampled request's ids identical${proposed:+; $proposed proposals verified}"; fi
exit $fail
