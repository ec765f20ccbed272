#!/usr/bin/env bash
# The main job from a fresh Debian 12 machine: dependencies, build, then a local cluster
# (router, prefill, decode and the OpenAI-compatible gateway on :8888) on the built-in demo
# model (an untrained tiny DeepSeek-V4.1) unless a model is given:
#   scripts/up.sh [--model-path DIR] [more `baton up` flags]
# then:  curl localhost:8888/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DBT_CUDA=AUTO >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)"
exec build/bin/baton up "$@"
