#!/usr/bin/env bash
# The deployment files start the services with flags the services take, from variables that
# are defined: every flag a Kubernetes manifest (deploy/k8s) or systemd unit (deploy/systemd)
# passes is one its binary lists in --help, and every variable it reads is set by the
# ConfigMap (or the pod's own env) or by baton.env.example. An unknown flag stops a service at
# start (exit 2): the decode StatefulSet passed --chunked-decode-size, and its pods could only
# crash-loop.
set -euo pipefail
src=${BT_SOURCE_DIR:?BT_SOURCE_DIR: the source tree}
bin=${BT_BIN_DIR:?BT_BIN_DIR: the built binaries}
deploy=${BT_DEPLOY_DIR:-$src/deploy} # (another tree's files, to see this test fail on them)
fail=0
checked=0

# check_flags FILE SERVICE FLAG...: each FLAG is in SERVICE's --help
check_flags() {
    local file=$1 svc=$2
    shift 2
    if [ ! -x "$bin/$svc" ]; then
        echo "FAIL $file: starts $svc, which this build has no binary for"
        fail=1
        return
    fi
    local help
    help=$("$bin/$svc" --help 2>&1 || true)
    for f in "$@"; do
        checked=$((checked + 1))
        if ! grep -q -- "^  $f " <<<"$help"; then
            echo "FAIL $file: $svc takes no $f (see $svc --help)"
            fail=1
        fi
    done
}

for y in "$deploy"/k8s/*.yaml; do
    svc=$(sed -n 's|^ *- /usr/local/bin/\(baton-[a-z]*\)$|\1|p' "$y")
    [ -n "$svc" ] || continue
    # shellcheck disable=SC2046
    check_flags "$y" "$svc" $(sed -n 's|^ *- \(--[a-z0-9-]*\).*|\1|p' "$y")
    for v in $(grep -o '\$([A-Za-z_][A-Za-z0-9_]*)' "$y" | tr -d '$()' | sort -u); do
        checked=$((checked + 1))
        if ! grep -q "^  $v:" "$deploy/k8s/configmap.yaml" && ! grep -q -- "- name: $v$" "$y"; then
            echo "FAIL $y: \$($v) is set neither by configmap.yaml nor by the pod's env"
            fail=1
        fi
    done
done

for u in "$deploy"/systemd/*.service; do
    svc=$(sed -n 's|^ExecStart=/usr/local/bin/\(baton-[a-z]*\).*|\1|p' "$u")
    [ -n "$svc" ] || continue
    cmd=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$u")
    # shellcheck disable=SC2046
    check_flags "$u" "$svc" $(grep -o -- '--[a-z][a-z0-9-]*' <<<"$cmd" | sort -u)
    for v in $(grep -o '\$[{]\?[A-Za-z_][A-Za-z0-9_]*' <<<"$cmd" | tr -d '${' | sort -u); do
        checked=$((checked + 1))
        if ! grep -q "^$v=" "$deploy/baton.env.example"; then
            echo "FAIL $u: \$$v is not in baton.env.example"
            fail=1
        fi
    done
done

if [ "$checked" -lt 40 ]; then
    echo "FAIL only $checked flags and variables found: the files' layout changed under this test"
    fail=1
fi
echo "$checked flags and variables checked"
exit $fail
