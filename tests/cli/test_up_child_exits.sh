#!/usr/bin/env bash
# `baton up` with a service that exits during its start (here a prefill group given a UCX
# transport that does not exist) says which one exited and how, at once, and stops the rest:
# it said the service "did not start within 50 s", as if it had been slow.
set -euo pipefail
bin=${BT_BIN_DIR:?BT_BIN_DIR: the built binaries}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
start=$(date +%s)
rc=0
timeout 60 "$bin/baton" up --demo-model --host 127.0.0.1 --port 0 --router-port 0 \
    --ucx-tls no-such-transport --start-timeout 50 >/dev/null 2>"$err" || rc=$?
took=$(($(date +%s) - start))
fail=0
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAIL baton up returned $rc (want a failure, before the 60 s timeout)"
    fail=1
fi
if ! grep -q "prefill-0 exited with status 1 before it listened" "$err"; then
    echo "FAIL baton up did not name the prefill group's exit:"
    tail -5 "$err"
    fail=1
fi
if [ "$took" -ge 30 ]; then
    echo "FAIL baton up took $took s to give up (it waited out a start timeout?)"
    fail=1
fi
echo "baton up gave up after $took s with status $rc"
exit $fail
