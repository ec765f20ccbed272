#!/usr/bin/env bash
# Ctrl-C on `baton up` while a request streams: every service drains (the gateway, the router
# and the decode group finish what they run), so the stream ends normally, and `baton up`
# waits for them. It killed what was left 5 s after the signal, and the router failed every
# request at once. The simulated decode step (100 ms) makes the request outlast those 5 s.
set -euo pipefail
bin=${BT_BIN_DIR:?BT_BIN_DIR: the built binaries}
dir=$(mktemp -d)
up_pid=
cleanup() {
    [ -n "$up_pid" ] && kill -KILL "$up_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
"$bin/baton" up --demo-model --host 127.0.0.1 --port 0 --router-port 0 --simulate \
    --sim-decode-step-ms-base 100 --sim-decode-step-ms-per-seq 0 >"$dir/up.out" 2>"$dir/up.err" &
up_pid=$!
port=
for _ in $(seq 1 300); do
    port=$(sed -n 's/^  gateway *127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$dir/up.out")
    grep -q "Ctrl-C stops it" "$dir/up.out" && [ -n "$port" ] && break
    kill -0 "$up_pid" 2>/dev/null || { echo "FAIL baton up exited"; tail -5 "$dir/up.err"; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "FAIL baton up did not start"; exit 1; }
timeout 60 curl -sN "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"hello","max_tokens":80,"ignore_eos":true,"stream":true}' >"$dir/stream" &
curl_pid=$!
for _ in $(seq 1 100); do # the first tokens
    [ "$(grep -c '^data: {' "$dir/stream" || true)" -ge 3 ] && break
    sleep 0.1
done
start=$(date +%s%N)
kill -INT "$up_pid"
rc=0
wait "$curl_pid" || rc=$?
up_rc=0
timeout 60 tail --pid="$up_pid" -f /dev/null || true
wait "$up_pid" || up_rc=$?
up_pid=
took_ms=$((($(date +%s%N) - start) / 1000000))
events=$(grep -c '^data: {' "$dir/stream" || true)
echo "stream across Ctrl-C: curl $rc, $events events, baton up $up_rc after $took_ms ms"
fail=0
if [ "$rc" -ne 0 ] || ! grep -q '"finish_reason":"length"' "$dir/stream" ||
    ! grep -q '^data: \[DONE\]' "$dir/stream" || grep -q '"error"' "$dir/stream"; then
    echo "FAIL the stream did not end normally:"
    tail -c 400 "$dir/stream"
    echo
    tail -5 "$dir/up.err"
    fail=1
fi
if [ "$up_rc" -ne 0 ]; then
    echo "FAIL baton up returned $up_rc"
    fail=1
fi
if ! grep -q "finishes within 30 s" "$dir/up.out"; then
    echo "FAIL baton up did not say it drains"
    fail=1
fi
exit $fail
