#!/usr/bin/env bash
# Installs every system dependency of Baton from Debian 12 packages. Idempotent: packages
# already present are not touched, and nothing is fetched when all are there.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake pkg-config clang libclang-rt-14-dev git curl ca-certificates
  # libraries (PLUMBING.md)
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libuv1-dev libucx-dev ucx-utils
  libcjson-dev node-llhttp libpcre2-dev libutf8proc-dev libcurl4-openssl-dev
  # tests: promtool (package prometheus) checks every /metrics
  prometheus
  # baton bench draws its PNG plots with gnuplot
  gnuplot-nox
)
# the OpenAI client tests need Node.js 18+ with npm; Debian's when none is installed
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
