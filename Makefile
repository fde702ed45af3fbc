# gpu-autorepair — the two commands of the README plus lint and bench.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run fresh test lint bench fuzz fuzz-api property crash model-check install slurm-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# setuptools' "Editable installation" banner is a UserWarning of the build backend
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install -q -e '.[dev,agent]'
	touch $(STAMP)

install: $(STAMP)

# Debian's Slurm + munge for the demo cluster and the Slurm tests (root only).
slurm-deps:
	@bash scripts/install-slurm.sh

run: install slurm-deps
	$(BIN)/autorepair up --demo

# The demo from scratch: forget the dev stack's state (.autorepair: Temporal history,
# PostgreSQL ledger, tokens, demo cluster) but keep .venv, then `make run`.
fresh:
	rm -rf .autorepair
	$(MAKE) run

test: install slurm-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -p no:cacheprovider

# lint-imports: the layering of docs/design.md §2 (contracts in .importlinter).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Every benchmark in turn (each prints its own table and, last, its figures as one JSON
# line, kept in $(BENCH_OUT)/<name>.json), then issue 30's figures beside their targets
# (tests/bench/support/summary.py: a table and one last JSON line).
BENCH_OUT ?= .bench
bench: install
	@rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT)
	@for f in tests/bench/*.py; do n=$$(basename $$f .py); echo "== $$f"; \
	  { $(BIN)/python $$f; echo "rc=$$?" > $(BENCH_OUT)/$$n.rc; } | tee $(BENCH_OUT)/$$n.log; \
	  if [ "$$(cat $(BENCH_OUT)/$$n.rc)" != "rc=0" ]; then echo "$$f failed"; exit 1; fi; \
	  tail -n 1 $(BENCH_OUT)/$$n.log > $(BENCH_OUT)/$$n.json; done
	@$(BIN)/python -m tests.bench.support.summary $(BENCH_OUT)

# 100,000+ hostile OTLP requests over both transports (tests/fuzz/otlp_fuzz.py); the last
# line gives cases/s, failures and the server's peak RSS. CI runs a short slice
# (tests/integration/test_otlp_fuzz.py).
fuzz: install
	$(BIN)/python tests/fuzz/otlp_fuzz.py --cases 100000

# schemathesis against the repair API's /api/v1/openapi.json as operator, detector, viewer
# and without a token, on the real ledger and a Temporal dev server (tests/fuzz/api_fuzz.py);
# the last line gives cases, cases/s and failures. CI runs a short slice
# (tests/integration/test_api_fuzz.py).
fuzz-api: install
	$(BIN)/python tests/fuzz/api_fuzz.py --cases 5000

# Stateful property test of the repair rails (tests/workflows/test_rails_property.py) with
# random programs, guard terminations and lease expiry among the steps; EXAMPLES=N sets how
# many (CI runs three fixed programs and a fixed-seed slice of 16). The last line gives
# examples run, failing examples, guard restarts, leaked time-skipping locks given back,
# programs run again because the test server's clock stopped, and seconds.
EXAMPLES ?= 200
property: install
	@rm -f .property.json; \
	RAILS_PROPERTY_EXAMPLES=$(EXAMPLES) RAILS_PROPERTY_REPORT=.property.json \
	  $(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 \
	  tests/workflows/test_rails_property.py; rc=$$?; \
	$(BIN)/python -c "import json; r = json.load(open('.property.json')); \
	print(f\"examples={r['examples']} failures={r['failures']} \
	guard_restarts={r['guard_restarts']} forced_unlocks={r['forced_unlocks']} \
	clock_stops={r['clock_stops']} seconds={r['seconds']}\")"; \
	rm -f .property.json; exit $$rc

# Crash run (tests/crash/crash.py): NODES x ROUNDS repairs on the dev stack (real worker
# and ingest processes, Temporal dev server, embedded PostgreSQL, kmock, Redfish emulator)
# while the worker, the ingest and PostgreSQL are SIGKILLed at seeded random points and
# restarted; then every repair ended once, no machine cycled twice, no node left
# cordoned, ledger = Temporal. The last line is the figures as JSON. CI runs a slice of
# 12 repairs and one kill per component (tests/crash/test_crash.py).
NODES ?= 16
ROUNDS ?= 4
SEED ?= 1
crash: install
	$(BIN)/python tests/crash/crash.py --nodes $(NODES) --rounds $(ROUNDS) --seed $(SEED)

# Everything `make run` created: .venv and .autorepair (`make fresh` keeps .venv).
clean:
	rm -rf $(VENV) .autorepair

# Exhaustive bounded check of the lifecycle machines (tests/model/: the machine action to
# DEPTH, the cluster guard to GUARD_DEPTH, the node to NODE_DEPTH): every event sequence
# up to its bound; the last line is `states=… transitions=… depth=…
# violations=0 seconds=…`, exit 1 on a violation (printed with its shortest trace).
# Times on one core of the 2-core development machine (Dec 2026): GUARD_DEPTH 6 about
# 65 s; DOMAIN_DEPTH (the guard's failure-domain world) 5 about 30 s, 6 about 5 min;
# NODE_DEPTH (tests/model/node_world.py, which branches more widely) 6 about 30 s, 7 about
# 2 min, 8 about 11 min and 13 GB; REPAIR_DEPTH (tests/model/repair_world.py) 16 about
# 1 s, 24 about 2 min; FLEET_DEPTH (tests/model/fleet_world.py: 3 nodes, the guard, the
# repairs and their machine actions; a line per depth) 4 about 25 s, 5 about 5 min.
DEPTH ?= 12
GUARD_DEPTH ?= 6
DOMAIN_DEPTH ?= 5
NODE_DEPTH ?= 6
REPAIR_DEPTH ?= 16
FLEET_DEPTH ?= 4
model-check: install
	$(BIN)/python -m tests.model --depth $(DEPTH) --guard-depth $(GUARD_DEPTH) --domain-depth $(DOMAIN_DEPTH) --node-depth $(NODE_DEPTH) --repair-depth $(REPAIR_DEPTH) --fleet-depth $(FLEET_DEPTH)
