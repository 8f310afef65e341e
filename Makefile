# Every target creates .venv on first use and installs the pinned torch and the project into it (`make demo`: what
# running lcfed needs; the other targets add the test, lint, docs and search tools).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
PYTEST_ARGS ?=

.PHONY: setup test test-core test-slow demo lint docs bench clean

# what running lcfed needs (`make demo`); the test, lint, docs and search tools come on top ($(STAMP))
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install -q --disable-pip-version-check -e .
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(RUN_STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[test,dev,search,parquet,docs]"
	@touch $(STAMP)

setup: $(STAMP)

# test files spread over TEST_WORKERS processes (pytest-xdist), a file's tests in one of them (its module
# fixtures start once); TEST_WORKERS=0 runs them in this process
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: $(STAMP)
	$(BIN)/python -X faulthandler -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

# the fast core: no Ray, cluster, server or child process (tests/conftest.py says how tests are marked)
test-core: $(STAMP)
	$(BIN)/python -X faulthandler -m pytest -q -m "not slow and not ray and not cluster and not server and not subprocess" $(XDIST) $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -s $(PYTEST_ARGS)

demo: $(RUN_STAMP)
	@mkdir -p .demo
	$(BIN)/lcfed run --config configs/demo.yaml --json .demo/lcfed.json
	$(BIN)/lcfed run --config configs/demo.yaml --set method.name=fedavg --json .demo/fedavg.json
	$(BIN)/lcfed run --config configs/demo.yaml --set method.name=standalone --json .demo/standalone.json
	@echo; $(BIN)/lcfed table .demo/lcfed.json .demo/fedavg.json .demo/standalone.json

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py --data-dir $(or $(DATA_DIR),~/.cache/lcfed)
	$(BIN)/python benchmarks/clustering_cost.py
	$(BIN)/python benchmarks/scale.py --data-dir $(or $(DATA_DIR),~/.cache/lcfed)
	$(BIN)/python benchmarks/flower_overhead.py --data-dir $(or $(DATA_DIR),~/.cache/lcfed)

# the site into site/, offline; --strict: a broken link, anchor or API reference fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check lcfed actors tune_jobs tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache mlruns mlartifacts mlflow.db site
