#!/usr/bin/env bash
# `make test`: the main suite, then the vLLM suite. The vLLM environment (downloads and unpacking,
# mostly I/O) is built in the background while the main suite runs, which leaves a core partly
# idle waiting on servers and browsers; the vLLM suite itself runs after, on a quiet machine.
#   scripts/test_all.sh [pytest args for the main suite...]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log="$(mktemp -t paritywatch-vllm-setup.XXXXXX.log)"
bash scripts/setup_vllm_env.sh >"$log" 2>&1 &
setup=$!
trap 'kill "$setup" 2>/dev/null' INT TERM

.venv/bin/python -m pytest "$@"
rc=$?
if [[ $rc == 5 ]]; then echo "make test: pytest collected no tests (exit 5): failing" >&2; fi

if ! wait "$setup"; then
  echo "make test: building the vLLM environment failed (scripts/setup_vllm_env.sh):" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
rm -f "$log"
[[ $rc == 0 ]] || exit "$rc"
exec bash scripts/test_vllm.sh -q
