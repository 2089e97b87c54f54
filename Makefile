# The README's two commands (quickstart, test) and the targets it names. Those that train create .venv and install
# the project first (needs Python 3.11+); gpu-check and gpu-ledger use the machine's own PyTorch.
PYTHON ?= python3
VENV := .venv
SESSIONS ?= 2            # pytest sessions of `make test`: the cores (see there)
BIN := $(VENV)/bin

.PHONY: quickstart test lint lock bench server gpu-check ledger gpu-ledger

# at the versions constraints.txt pins (the lock: those CI passed with), not the registry's newest
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -c constraints.txt -e '.[dev]'
	@# pip byte-compiles one file at a time; this uses every core (a file only a newer Python reads stays as pip leaves
	@# it), and skips the packages' own test suites (a fifth of the files), which nothing here imports
	$(BIN)/python -c 'import compileall, re, sys; compileall.compile_dir(sys.argv[1], quiet=2, workers=0, \
	  rx=re.compile(r"site-packages/(.+/)?tests/"))' $(VENV)/lib
	touch $@

# the whole pipeline (download, train, aggregate) on the quick setting: LeNet, real CIFAR-10, minutes on a CPU
quickstart: $(BIN)/.installed
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m cheaptrain.quick

# lint, then every test (unit tests and the end-to-end runs of the real stages on the shared CIFAR-10) in SESSIONS
# pytest sessions at once, one a core: most tests keep one core busy (a stage in a subprocess, then the next), and two
# keep 2 cores 98-100% busy (a third measured no faster, docs/measured.md). They share one queue of test files
# (tests/conftest.py: each runs the files it claims first), so all stay busy until it is empty. The main session also
# runs the tests that read the quick pipeline (which conftest.py starts in the background for it); the helpers' output
# follows the main one's. OpenMP threads sleep while waiting: the same results, and no spinning against a neighbour.
# A background job ignores Ctrl-C: the trap ends the helpers with the main session.
test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@export OMP_WAIT_POLICY=PASSIVE CHEAPTRAIN_TEST_QUEUE=$$(mktemp -d); helpers=""; \
	for n in $$(seq 2 $(SESSIONS)); do \
	  CHEAPTRAIN_TEST_ROLE=helper $(BIN)/python -m pytest > .pytest-helper-$$n.log 2>&1 & helpers="$$helpers $$!"; \
	done; \
	trap 'kill $$helpers 2>/dev/null; rm -rf "$$CHEAPTRAIN_TEST_QUEUE"; exit 130' INT TERM HUP; \
	$(BIN)/python -m pytest; status=$$?; \
	n=1; for pid in $$helpers; do n=$$((n + 1)); wait $$pid || status=1; echo "== helper session $$n"; cat .pytest-helper-$$n.log; done; \
	rm -rf "$$CHEAPTRAIN_TEST_QUEUE"; exit $$status

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# constraints.txt from .venv as it is: to upgrade a package, install it there (.venv/bin/pip install -U torch), run
# `make test`, then this (src/cheaptrain/lock.py)
lock: $(BIN)/.installed
	$(BIN)/python -m cheaptrain.lock

# an MLflow tracking server for a team (docs/scaling.md); HOST=0.0.0.0 to serve other machines; ALLOWED_HOSTS: the
# Host headers it accepts (default: private IPs), besides localhost and the name in the URI it prints
server: $(BIN)/.installed
	$(BIN)/python -m cheaptrain.server --host $(or $(HOST),127.0.0.1) --port $(or $(PORT),5000) \
		$(if $(ALLOWED_HOSTS),--allowed-hosts '$(ALLOWED_HOSTS)')

# on a CUDA machine with PyTorch alone (no install: such machines often have no network): the cuda tests, the
# throughput table, every method, concurrent runs; under 10 minutes (docs/gpu.md)
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py $(or $(OUT),gpu-check)

# the CPU speed claims of docs/measured.md, one script after another (minutes on 2 CPU cores; noise.py, which trains
# the quick runs twice, and the GPU scripts run on their own);
# the loader, DFP and malloc scripts read the prepared CIFAR-10 that `make quickstart` leaves in data/prepared (half
# of its training images: each of their epochs half as long as on all of them)
bench: $(BIN)/.installed
	@test -d data/prepared/cifar10 || { echo "no data/prepared/cifar10: run 'make quickstart' first"; exit 1; }
	for name in loader malloc dfp wus checkpoint guards shapes; do echo "== benchmarks/$$name.py"; $(BIN)/python benchmarks/$$name.py || exit 1; done

# one run at a paper's setting on CIFAR-10 into the results ledger, through the pipeline (docs/ledger.md);
# resumes where a stopped one left off; LEDGER=retrain replaces an entry that other training code trained (where
# `python stages/train.py --check` says it stops the run). In the background, then commit the entry:
#   nohup make ledger STUDY=wus MODEL=alexnet METHOD=wus SEED=1 > wus-1.log 2>&1 &    git add ledger && git commit
CIFAR10 ?= $(or $(wildcard $(abspath ../shared/datasets/cifar10-jpg.tar.gz)),$(wildcard carry/cifar10-jpg.tar.gz),torchvision)
THREADS ?= 1
LEDGER ?= record
ledger: $(BIN)/.installed
	@test -n "$(STUDY)" -a -n "$(MODEL)" -a -n "$(METHOD)" -a -n "$(SEED)" || { \
	  echo "usage: make ledger STUDY=dfp|wus MODEL=<model> METHOD=<method> SEED=<n> [THREADS=1] [CIFAR10=<archive>] [LEDGER=retrain]"; \
	  exit 2; }
	PATH="$(abspath $(BIN)):$$PATH" DVC_NO_ANALYTICS=1 $(BIN)/dvc exp run --temp \
	  -n ledger-$(STUDY)-$(MODEL)-$(METHOD)-$(SEED) -S 'download.datasets=[cifar10]' \
	  -S 'download.cifar10.source=$(CIFAR10)' -S 'grid.dfp.datasets=[cifar10]' -S 'grid.wus.datasets=[cifar10]' \
	  -S 'grid.$(STUDY).models=[$(MODEL)]' -S 'grid.$(STUDY).methods=[$(METHOD)]' -S 'grid.$(STUDY).seeds=[$(SEED)]' \
	  -S 'train.threads=$(THREADS)' -S 'train.ledger=$(LEDGER)' train_$(STUDY)

# on a CUDA machine with PyTorch alone (no install, no MLflow, no DVC; docs/gpu.md): several runs of one model at a
# paper's setting at once (one run leaves a large GPU mostly idle) into the results ledger, each logging to
# gpu-ledger/<run>.log; fails when one of them failed. Detached, the runs outlive a time-limited command:
#   setsid nohup make gpu-ledger STUDY=wus MODEL=resnet18 METHODS="baseline wus wus_lr" SETTINGS="-S train.compile=true" &
gpu-ledger: SEED ?= 0
gpu-ledger: GPU_LEDGER_LOG = gpu-ledger/$(STUDY)-cifar10-$(MODEL)-$$method-s$(SEED).log
# exit status 0 when data/prepared/cifar10 holds every CIFAR-10 training image, as the runs train on: the quickstart's
# half fails each run's check_prepared, so it is prepared again (as gpu_session.py's prepare_data decides)
gpu-ledger: FULL_CIFAR10 = import sys; sys.path.insert(0, "src"); from cheaptrain.config import prepared_train_size; \
  sys.exit(prepared_train_size("data/prepared/cifar10") is not None)
gpu-ledger:
	@test -n "$(STUDY)" -a -n "$(MODEL)" -a -n "$(METHODS)" || { \
	  echo 'usage: make gpu-ledger STUDY=dfp|wus MODEL=<model> METHODS="<method> ..." [SEED=0] [SETTINGS="-S key=value ..."] [CIFAR10=<archive>]'; \
	  exit 2; }
	@$(PYTHON) -c '$(FULL_CIFAR10)' 2>/dev/null || { echo "data/prepared/cifar10: not the full training set, preparing it"; \
	  CIFAR10_SOURCE=$(CIFAR10) $(PYTHON) stages/download.py --dataset cifar10 --no-mlflow; }
	@mkdir -p gpu-ledger
	@pids=; for method in $(METHODS); do \
	  log=$(GPU_LEDGER_LOG); echo "$$method: training, log in $$log"; \
	  $(PYTHON) stages/train.py --study $(STUDY) --dataset cifar10 --model $(MODEL) --method $$method --seed $(SEED) \
	    --no-mlflow $(SETTINGS) > $$log 2>&1 & pids="$$pids $$!"; \
	done; failed=0; for pid in $$pids; do wait $$pid || failed=1; done; \
	for method in $(METHODS); do tail -n 1 $(GPU_LEDGER_LOG); done; exit $$failed
