# The commands of the README. Each sets up .venv on first use with only what it runs (example:
# torchstep_prof; report: and plotly; test: every extra, the frameworks and the test tools),
# then runs. torch 2.13.0 goes in first and is pinned by a constraints file for everything after
# it: a bare `torch`, or a framework allowed to "upgrade" it, would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c $(VENV)/constraints.txt
BASE := $(VENV)/.installed
REPORT := $(VENV)/.installed-report
FULL := $(VENV)/.installed-extras
PLOTLY := plotly==7.1.0
# The framework versions the integration tests run against (the extras in setup.cfg are ranges).
FRAMEWORKS := transformers==5.23.0 accelerate==1.15.0 lightning==2.6.6 ray==2.60.0 $(PLOTLY) prometheus_client==0.26.0
# What the interop tests read traces with: `torchstep-prof hta` makes a folder for it.
INTEROP := HolisticTraceAnalysis==0.5.0
# The linters `make lint` runs (their settings: ruff.toml and setup.cfg's [mypy]). Pinned: a new
# release adds rules, and CI would fail on code nobody changed.
LINTERS := ruff==0.17.6 mypy==2.4.1
LINT := $(VENV)/.installed-lint

.PHONY: example report test lint bench bench-smoke browser prometheus valgrind clean

$(BASE): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	echo "torch==2.13.0" > $(VENV)/constraints.txt
	$(PIP) torch==2.13.0 numpy
	$(PIP) -e .
	touch $(BASE)

# `make report`: the [report] extra (plotly) and nothing else.
$(REPORT): $(BASE)
	$(PIP) -e '.[report]' $(PLOTLY)
	touch $(REPORT)

# The extras the test suite exercises: report (plotly), transformers, lightning, ray, metrics,
# and the test tools.
$(FULL): $(BASE)
	$(PIP) -e '.[test,report,transformers,lightning,ray,metrics]' $(FRAMEWORKS) $(INTEROP)
	touch $(FULL)

# One run per folder: a second run's traces beside the first's would make every command
# choose between the two runs (and warn).
example: $(BASE)
	rm -rf outputs/profile
	$(BIN)/python examples/rl_step.py

report: $(REPORT)
	rm -rf outputs/profile
	$(BIN)/python examples/rl_step.py
	$(BIN)/torchstep-prof report outputs/profile -o outputs/report.html

# Headless Chromium for the report's browser tests: installed through apt-get when running as
# root (CI); elsewhere those tests skip, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium is not installed: the report's browser tests will be skipped"

# The Prometheus server the metrics test scrapes with (Debian package `prometheus`): installed
# through apt-get when running as root (CI); elsewhere that test skips, saying so. The test starts
# its own instance; the package's service, if it starts, does not matter.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; } \
	  || echo "prometheus is not installed: the Prometheus scrape test will be skipped"

# valgrind's callgrind counts the instructions of a step for bench_run's target (bench/_instructions.py):
# installed through apt-get when running as root; elsewhere that target is not measured, and the
# counter's own test skips, saying so.
valgrind:
	@command -v valgrind >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; } \
	  || echo "valgrind is not installed: bench_run counts no instructions"

# After the extras: mypy then checks the integrations against the frameworks' own types, as
# it does on any machine with them installed.
$(LINT): $(FULL)
	$(PIP) $(LINTERS)
	touch $(LINT)

lint: $(LINT)
	$(BIN)/ruff check torchstep_prof tests bench examples
	$(BIN)/ruff format --check torchstep_prof
	$(BIN)/mypy

# Every bench script, briefly: it checks they run to their tables, not their timings (a crash
# or a timeout fails it). About 2 minutes on 2 cores; writes no bench/RESULTS.md. The extras:
# bench_report and bench_scale run `torchstep-prof report` (plotly).
bench-smoke: $(FULL)
	$(BIN)/python bench/run_all.py --smoke

# In this order: lint, the bench smoke, then the tests (the prerequisites run left to right).
test: lint bench-smoke $(FULL) browser prometheus valgrind
	$(BIN)/python -m pytest

bench: $(FULL) valgrind
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) outputs .pytest_cache .hypothesis .ruff_cache .mypy_cache *.egg-info report.html
