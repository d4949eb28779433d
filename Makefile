# The verbs a contributor, the README and CI share. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .uv/bin/uv
VENV := .venv
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
# Every Python process the suite starts (pytest's workers, each `tokenwire ...` child) reads
# compiled bytecode written once, instead of compiling its imports again (ADR 0038).
unexport PYTHONDONTWRITEBYTECODE
# pytest-xdist workers for `make test` (ADR 0038: measured on 2 cores, idle and under load).
TEST_WORKERS ?= 4

.PHONY: demo test lint typecheck bench bench-peer bench-long bench-smoke schemas install browser clean fuzz faults soak

# The pinned uv, in a virtual environment of its own. The system's pip installs it there (pip
# 22.3+: --python), so that no pip is installed into .uv (and compiled) only to install uv;
# without that pip, .uv gets its own pip first, as `python -m venv` would give it.
$(UV):
	$(PYTHON) -m venv --without-pip .uv
	$(PYTHON) -m pip --python .uv/bin/python install --quiet "uv==$(UV_VERSION)" 2>/dev/null \
	  || { .uv/bin/python -m ensurepip --default-pip >/dev/null \
	  && .uv/bin/python -m pip install --quiet "uv==$(UV_VERSION)"; }

$(VENV)/.synced: $(UV) uv.lock pyproject.toml
	$(UV) sync --frozen --all-extras --quiet
	touch $@

install: $(VENV)/.synced

# The session viewer's test drives Debian's headless Chromium; install it when we can (root).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the viewer test will skip (and fail under CI=true)"; }

demo: install
	$(VENV)/bin/tokenwire demo

# mypy runs beside the tests (its report follows theirs): the tests wait on processes and
# sockets much of the time, and mypy fills that time on the cores. One collection first
# compiles the suite's imports once; else each worker compiled them all at once (ADR 0038).
test: install browser lint
	@echo "mypy runs beside pytest; its report follows the tests'"
	@$(VENV)/bin/mypy > $(VENV)/mypy.out 2>&1 & mypy=$$!; \
	  $(VENV)/bin/pytest --collect-only -q > /dev/null 2>&1; \
	  $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope; tests=$$?; \
	  wait $$mypy; types=$$?; echo "$(VENV)/bin/mypy"; cat $(VENV)/mypy.out; \
	  [ $$tests -ne 0 ] && exit $$tests; exit $$types

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: install
	$(VENV)/bin/mypy

# The one-run suite (docs/benchmarks.md): ~12 min on 2 idle cores, plus a one-time install of
# the LiteLLM peer into .bench-venv/. BENCH=<part> runs one part; BENCH_ARGS=--final once the
# machine is quiet (drops the "preliminary" mark); --no-peer skips the peer.
bench: install
	$(VENV)/bin/python -m bench $(BENCH) $(BENCH_ARGS)

# Install the LiteLLM peer into .bench-venv/ ahead of a timed run (make bench does it if absent).
bench-peer: install
	$(VENV)/bin/python -c "from bench._peer import ensure_installed as e; print(e())"

bench-long: install
	$(VENV)/bin/python -m bench --profile long $(BENCH) $(BENCH_ARGS)

bench-smoke: install
	$(VENV)/bin/python -m bench --profile smoke --no-peer --no-docs --out .bench-smoke $(BENCH)

# The adapters' long fuzz run (docs/providers.md, "Fuzzing"): FUZZ_EXAMPLES cases per adapter
# and strategy (mutated recordings, random SSE); the default suite runs 30 of each. FUZZ=<-k
# expression> runs a part (e.g. FUZZ=mutated); FUZZ_TIMEOUT bounds each test (seconds), and
# each test prints its cases, rate and the peak RSS so far. Then schemathesis against the real
# gateway's /openapi.json, SCHEMATHESIS_EXAMPLES per operation and mode (the suite runs 10).
FUZZ_EXAMPLES ?= 100000
FUZZ_TIMEOUT ?= 36000
SCHEMATHESIS_EXAMPLES ?= 1000
fuzz: install
	TOKENWIRE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(VENV)/bin/pytest tests/fuzz -q -p no:randomly \
	  --timeout=$(FUZZ_TIMEOUT) $(if $(FUZZ),-k "$(FUZZ)")
	SCHEMATHESIS_EXAMPLES=$(SCHEMATHESIS_EXAMPLES) $(VENV)/bin/pytest tests/gateway/test_schemathesis.py \
	  -q -p no:randomly --timeout=$(FUZZ_TIMEOUT)

# The fault tier alone at full size (FAULTS_SESSIONS concurrent sessions per case, the store
# down FAULTS_OUTAGE_S at least; CI runs 30 and the load's length), its measured rows
# regenerating docs/reliability.md's table.
FAULTS_SESSIONS ?= 100
FAULTS_OUTAGE_S ?= 10
faults: install
	rm -f .faults.jsonl
	TOKENWIRE_FAULTS_REPORT=$(abspath .faults.jsonl) TOKENWIRE_FAULTS_SESSIONS=$(FAULTS_SESSIONS) \
	  TOKENWIRE_FAULTS_STORE_OUTAGE_S=$(FAULTS_OUTAGE_S) $(VENV)/bin/pytest tests/faults \
	  tests/telemetry/test_crash_between_publish_and_ack.py -q -p no:randomly -o timeout=1200
	$(VENV)/bin/python -m tests.faults.table .faults.jsonl docs/reliability.md

# Minutes of steady load with random faults (SOAK_MINUTES, SOAK_SEED); its row joins the table.
SOAK_MINUTES ?= 5
soak: install
	$(VENV)/bin/python -m tests.faults.soak --minutes $(SOAK_MINUTES) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) --report $(abspath .faults.jsonl)
	$(VENV)/bin/python -m tests.faults.table .faults.jsonl docs/reliability.md

schemas: install
	$(VENV)/bin/python -m tokenwire.schemas.jsonschema schemas/

clean:
	rm -rf $(VENV) .uv .tokenwire .pytest_cache .mypy_cache .ruff_cache
