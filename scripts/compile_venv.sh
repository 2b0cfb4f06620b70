#!/usr/bin/env bash
# Byte-compile an environment's site-packages on every core, once, after `pip install --no-compile`
# (pip compiles one file at a time: a minute for .venv here, this about half that).
# Compiled at install, not on import: with PYTHONDONTWRITEBYTECODE set (as on these machines) no
# .pyc is ever written on import, and every process of the suite (every server, demo and vLLM
# engine it starts) would compile torch and transformers again. A file that does not compile (some
# packages ship Python 2 examples) is skipped, as pip skips it.
#   scripts/compile_venv.sh PYTHON      # PYTHON: the environment's interpreter
set -euo pipefail
"${1:?usage: compile_venv.sh PYTHON}" -c \
  "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
