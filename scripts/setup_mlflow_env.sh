#!/usr/bin/env bash
# Build (or reuse) the MLflow environment bench/ingest.py measures against, cached OUTSIDE the clone
# (like scripts/setup_vllm_env.sh): MLflow pins its own sqlalchemy/alembic, so it never goes into .venv.
#
#   scripts/setup_mlflow_env.sh          # prints the venv path on its last line
#   PARITYWATCH_MLFLOW_VENV=/some/dir scripts/setup_mlflow_env.sh
#
# Idempotent: a stamp (MLflow version) makes a cached run take a second. MLflow is pinned so the
# ratio against it means the same thing from one run to the next. It also keeps an empty, migrated
# MLflow database ($VENV/mlflow-template.db): a bench copies it instead of waiting for MLflow's
# schema migrations at every server start.
set -euo pipefail

VENV="${PARITYWATCH_MLFLOW_VENV:-$HOME/.cache/paritywatch/venv-mlflow}"
PYTHON="${PARITYWATCH_MLFLOW_PYTHON:-python3}"
MLFLOW_VERSION="3.17.2"
STAMP="$VENV/.paritywatch-stamp"
want_stamp="mlflow=$MLFLOW_VERSION"

log() { echo "[setup_mlflow_env] $*" >&2; }

TEMPLATE="$VENV/mlflow-template.db"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -x "$VENV/bin/mlflow" && -s "$TEMPLATE" ]]; then
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
log "installing mlflow==$MLFLOW_VERSION (once; a few minutes)"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --progress-bar off "mlflow==$MLFLOW_VERSION"
"$VENV/bin/python" -c "import mlflow; print('mlflow', mlflow.__version__)" >&2
log "migrating an empty MLflow database: $TEMPLATE"
rm -f "$TEMPLATE" "$TEMPLATE.tmp"
"$VENV/bin/mlflow" db upgrade "sqlite:///$TEMPLATE.tmp" >/dev/null 2>&1
mv "$TEMPLATE.tmp" "$TEMPLATE"
echo "$want_stamp" > "$STAMP"
log "built in $(( $(date +%s) - start )) s: $VENV"
echo "$VENV"
