#!/usr/bin/env bash
# The main job from a fresh Debian 12 machine: dependencies, build, then run Baton on the
# built-in demo model (an untrained tiny DeepSeek-V4.1) unless a model is given:
#   scripts/up.sh [--model-path DIR] [more baton flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DBT_CUDA=AUTO >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)"
exec build/bin/baton generate --input-ids 0,1000,42,71,78 --max-new-tokens 16 --temperature 0 "$@"
