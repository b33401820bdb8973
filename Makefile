# make demo: the product on a simulated cluster.  make test: lint, type-check, tests.
VENV   ?= .venv
PYTHON ?= $(shell command -v python3.13 2>/dev/null || echo python3)
BIN    := $(VENV)/bin
# The test toolchain (the BigQuery emulator, mypy, ruff, pytest...), installed by the first
# target that needs it: `make demo` installs only the product.
TESTED := $(VENV)/.test-extras

.PHONY: demo test lint tools simulate bench clean alerts dashboards docs

# Packages are installed by uv (from PyPI, into the virtualenv): a tenth of pip's time for
# the test toolchain from an empty cache (docs/benchmarks.md).
UV     := $(BIN)/uv pip install --python $(BIN)/python --quiet

$(BIN)/gke-gpu-exporter: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet uv
	$(UV) -e .
	@touch $@

$(TESTED): $(BIN)/gke-gpu-exporter
	$(UV) -e '.[test]'
	@touch $@

demo: $(BIN)/gke-gpu-exporter
	$(BIN)/gke-gpu-exporter demo

# Three workers on two cores, a test file each at a time: much of the suite waits on the
# servers it starts (Prometheus, the BigQuery emulator, the demo), and each file's fixtures
# stay in one worker.
test: $(TESTED) lint tools
	$(BIN)/pytest -n 3 --dist loadfile

tools:
	@command -v promtool >/dev/null || { echo "promtool is missing: apt-get install prometheus"; exit 1; }
	@command -v prometheus >/dev/null || { echo "prometheus is missing: apt-get install prometheus"; exit 1; }
	@command -v kubectl >/dev/null || { echo "kubectl is missing: apt-get install kubernetes-client (or kubectl)"; exit 1; }

lint: $(TESTED)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

simulate: $(BIN)/gke-gpu-exporter
	$(BIN)/gke-gpu-exporter simulate

bench: $(BIN)/gke-gpu-exporter
	$(BIN)/python benchmarks/simulator_scale.py
	$(BIN)/python benchmarks/exporter_cycle.py
	$(BIN)/python benchmarks/cycle_floor.py
	$(BIN)/python benchmarks/weekly_report.py
	$(BIN)/python benchmarks/demo_week.py

alerts: $(BIN)/gke-gpu-exporter
	$(BIN)/python alerts/build.py
	promtool check rules alerts/rules.yaml
	cd alerts && promtool test rules tests.yaml tests-slow.yaml

dashboards: $(BIN)/gke-gpu-exporter
	$(BIN)/python dashboards/build.py

docs: $(BIN)/gke-gpu-exporter
	$(BIN)/python docs/build.py

clean:
	rm -rf $(VENV) demo-out sim-out .pytest_cache .mypy_cache .ruff_cache
