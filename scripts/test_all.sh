#!/usr/bin/env bash
# `make test`: `make install system-deps`, the linter, then the main suite, with the vLLM suite beside it.
# One background job builds the vLLM environment from the start (downloads and unpacking, at the
# lowest CPU and I/O priority, beside the install: 150 s on a fresh machine, 2026-12-02), then runs
# the vLLM suite while the main suite goes on: the main suite's workers wait on servers, browsers
# and timed scenarios as much as they compute. Run one after the other, the two took 10:35 and
# 2:10. The vLLM suite's output goes to a log, printed whole if it fails, as its summary if not.
#   scripts/test_all.sh [pytest args for the main suite...]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log="$(mktemp -t paritywatch-vllm.XXXXXX.log)"
low=(nice -n 19)
if command -v ionice >/dev/null; then low+=(ionice -c 3); fi
# Its own process group (setsid), so that stopping it stops its pip or its pytest too.
setsid bash -c '"$@" || exit 90; echo "== vLLM suite"; exec bash scripts/test_vllm.sh -q' vllm-job \
  "${low[@]}" bash scripts/setup_vllm_env.sh >"$log" 2>&1 &
vllm=$!
trap 'kill -- -"$vllm" 2>/dev/null' INT TERM EXIT

"${MAKE:-make}" --no-print-directory install system-deps || exit $?
# The linter (pyproject.toml's [tool.ruff]) first: seconds, and its verdict is known before the suite's.
.venv/bin/ruff check . >&2
lint_rc=$?
.venv/bin/python -m pytest "$@"
rc=$?
if [[ $rc == 5 ]]; then echo "make test: pytest collected no tests (exit 5): failing" >&2; fi

wait "$vllm"
vllm_rc=$?
grep -E '^\[setup_vllm_env\] (built|cached)' "$log" | head -n 1 >&2  # how long the build took
if [[ $vllm_rc == 90 ]]; then
  echo "make test: building the vLLM environment failed (scripts/setup_vllm_env.sh):" >&2
  tail -n 40 "$log" >&2
elif [[ $vllm_rc != 0 ]]; then
  echo "make test: the vLLM suite failed (scripts/test_vllm.sh):" >&2
  sed -n '/^== vLLM suite$/,$p' "$log" >&2
else
  echo "vLLM suite: $(tail -n 1 "$log")"
fi
rm -f "$log"
[[ $rc == 0 ]] || exit "$rc"
if [[ $lint_rc != 0 ]]; then echo "make test: ruff found problems (above; \`make lint\` repeats them)" >&2; exit "$lint_rc"; fi
exit "$vllm_rc"
