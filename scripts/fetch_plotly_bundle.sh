#!/usr/bin/env bash
# The dashboard's plotly.js: the official partial bundle `plotly.js-basic-dist-min` (scatter, bar
# and pie traces with the core layout: what frontend/static/charts.js draws) at the same plotly.js
# version as the full bundle inside the Python `plotly` package, fetched from the npm registry into
# frontend/vendor/ (git-ignored) and gzipped once. The backend serves it when it is there and the
# full 4.7 MB bundle otherwise, so a machine without npm still gets a working dashboard.
#
#   scripts/fetch_plotly_bundle.sh [PYTHON]      # PYTHON: the interpreter with plotly (.venv's)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
DEST="$ROOT/frontend/vendor"
log() { echo "[fetch_plotly_bundle] $*" >&2; }

VERSION="$("$PY" -c 'import plotly.offline as o; print(o.get_plotlyjs_version())')"
OUT="$DEST/plotly-basic-$VERSION.min.js"
if [[ -s "$OUT" && -s "$OUT.gz" ]]; then
  log "cached: $OUT"
  exit 0
fi
if ! command -v npm >/dev/null; then
  log "npm not found: the dashboard serves the full plotly.js bundle (slower first chart)"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && npm pack --silent "plotly.js-basic-dist-min@$VERSION" >/dev/null); then
  log "npm could not fetch plotly.js-basic-dist-min@$VERSION: the dashboard serves the full bundle"
  exit 0
fi
tar -xzf "$tmp"/plotly.js-basic-dist-min-*.tgz -C "$tmp" package/plotly-basic.min.js
mkdir -p "$DEST"
rm -f "$DEST"/plotly-basic-*.min.js "$DEST"/plotly-basic-*.min.js.gz  # another version's
gzip -9 -n -c "$tmp/package/plotly-basic.min.js" > "$tmp/bundle.gz"
mv "$tmp/package/plotly-basic.min.js" "$OUT"
mv "$tmp/bundle.gz" "$OUT.gz"   # last: its presence marks a complete fetch
log "plotly.js $VERSION basic bundle: $(stat -c %s "$OUT") bytes, gzipped $(stat -c %s "$OUT.gz")"
