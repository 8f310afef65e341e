# Every target creates .venv on first use and installs the pinned torch and the project into it (`make install`, which
# `make demo` runs if needed: what running lcfed needs; the other targets add the test, lint, docs and search tools).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
PYTEST_ARGS ?=

# uv installs what pip does (the same versions) in half the time: torch's CUDA wheels, Ray and MLflow from empty caches
# took 2.4 min with uv, 5 min with pip on a loaded 2-core machine. INSTALLER=pip uses pip, as does a uv pip cannot install.
INSTALLER  ?= uv
UV_VERSION ?= 0.13.9
PIP_INSTALL = $(BIN)/python -m pip install -q --disable-pip-version-check

# `$(IN_VENV) pip install ARGS`: ARGS installed into the venv by $(INSTALLER). uv reads neither pip.conf nor PIP_*: it
# gets pip's indexes, find-links and constraints from `pip config list` (a local wheel mirror, if the machine has one).
# --compile-bytecode: pip compiles too, and without .pyc (PYTHONDONTWRITEBYTECODE set) every lcfed process and Ray
# worker would import twice as slowly.
define IN_VENV
@in_venv() { shift 2; \
	  if [ "$(INSTALLER)" = uv ] && { test -x $(BIN)/uv || $(PIP_INSTALL) uv==$(UV_VERSION) \
	      || { echo "uv could not be installed: pip installs instead"; false; }; }; then \
	    src=$$($(BIN)/python -m pip config list 2>/dev/null | sed 's/\\n/ /g' \
	      | sed -nE "s/^[^.]*\.(index-url|extra-index-url|find-links|constraint)='(.*)'$$/\1 \2/p" \
	      | awk '$$1 == "index-url" && seen++ { next } { for (i = 2; i <= NF; i++) printf "--%s %s ", $$1, $$i }'); \
	    echo "uv pip install $$*"; \
	    $(BIN)/uv pip install -q --python $(BIN)/python --index-strategy unsafe-best-match --compile-bytecode $$src "$$@"; \
	  else \
	    echo "pip install $$*"; $(PIP_INSTALL) "$$@"; \
	  fi; }; in_venv
endef

# what running lcfed needs (`make install`, `make demo`); the test, lint, docs and search tools come on top ($(STAMP))
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(IN_VENV) pip install torch==2.14.1 torchvision==0.29.1 -e .
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(RUN_STAMP)
	$(IN_VENV) pip install -e ".[test,dev,search,parquet,docs]"
	@touch $(STAMP)

install: $(RUN_STAMP)

setup: $(STAMP)

.PHONY: install setup test test-core test-slow demo lint docs bench clean

# test files spread over TEST_WORKERS processes (pytest-xdist), a file's tests in one of them (its module
# fixtures start once); TEST_WORKERS=0 runs them in this process
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# the core has no Ray, cluster or server to share per module: its tests are stolen one by one, so the workers end together
XDIST_CORE = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

# the project's own modules byte-compiled first (changed files only): an editable install leaves them to each
# process, and where PYTHONDONTWRITEBYTECODE is set every lcfed command and Ray worker would compile them again
COMPILE = @$(BIN)/python -m compileall -q lcfed actors tune_jobs tests > /dev/null

test: $(STAMP)
	$(COMPILE)
	$(BIN)/python -X faulthandler -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

# the fast core: no Ray, cluster, server or child process (tests/conftest.py says how tests are marked)
test-core: $(STAMP)
	$(COMPILE)
	$(BIN)/python -X faulthandler -m pytest -q -m "not slow and not ray and not cluster and not server and not subprocess" $(XDIST_CORE) $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(COMPILE)
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
