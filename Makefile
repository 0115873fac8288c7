# The scaling lab. `make demo` runs the main job on the embedded default data
# (no network, no GPU); `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup lock-cuda horovod test test-quick reliability bench bench-gpu demo notebooks paper lab clean-venv records-doc help

help:
	@echo "make demo    run notebooks/01_train via papermill, 1 and 2 processes, and 02_profile on 2, embedded digits (no network, no GPU)"
	@echo "make notebooks  regenerate the parameters cell and the .ipynb twins of notebooks/*.py"
	@echo "make paper   analyse the records, then build the paper, the EuroHPC proposal and the slides"
	@echo "make lab     JupyterLab on this repository (notebooks/*.py open as notebooks)"
	@echo "make setup   create .venv with the locked dependencies (torch 2.13.0); CUDA=1 [TORCH_INDEX=URL] on a GPU cluster"
	@echo "make lock-cuda  constraints-cuda.txt: the CUDA runtime packages pip resolves for torch (TORCH_INDEX=URL for another CUDA)"
	@echo "make horovod build Horovod 0.28.1 into .venv (patched for C++17; ~3 min; engine=horovod)"
	@echo "make test    run the whole suite on two workers and write tests/DURATIONS.md (sets up and builds Horovod first)"
	@echo "make test-quick  the unit tier: in-process tests only, about 2 minutes, needs nothing but make setup"
	@echo "make reliability the fault-injection suite, and its measured table into docs/reliability.md"
	@echo "make bench   print throughput tables (notebook overhead; lab vs seed-style script; pipelines; 1 vs 2 processes; bigMNIST; DCRNN; MPI vs a C loop; Open MPI vs MPICH)"
	@echo "make bench-gpu  on a GPU node: the GPU validation (precisions, compile, NCCL, seed ratio, MFU) into results/bench/"
	@echo "make records-doc  regenerate results/README.md from kernels/records/schema.py"

setup: $(STAMP)

# CUDA=1: a GPU cluster's setup, also under constraints-cuda.txt (the CUDA runtime torch brings),
# checked after the install. TORCH_INDEX: a PyTorch wheel index for another CUDA than PyPI's
# (e.g. https://download.pytorch.org/whl/cu126 for a driver older than CUDA 13); lock it first
# with `make lock-cuda TORCH_INDEX=...`. tools/lock.py says more.
CUDA ?=
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple)
TORCH_LOCK := -c constraints.txt $(if $(CUDA),-c constraints-cuda.txt)

# torch first, alone, so the rest cannot drag in a different torch build;
# then everything else under the lock. pip fails rather than resolve another torch.
$(STAMP): requirements.txt constraints.txt constraints-cuda.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade $(TORCH_LOCK) $(TORCH_FROM) "torch==2.13.0" numpy
	$(BIN)/python -m pip install -q -r requirements.txt $(TORCH_LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import torch, numpy; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'numpy', numpy.__version__)"
	$(if $(CUDA),$(BIN)/python tools/lock.py verify constraints-cuda.txt)
	touch $(STAMP)

# What pip would install for torch==2.13.0 on a GPU machine (nothing is installed), as constraints-cuda.txt.
lock-cuda: setup
	$(BIN)/python -m pip install --dry-run --quiet --ignore-installed -c constraints.txt $(TORCH_FROM) \
		--report $(VENV)/cuda-report.json "torch==2.13.0"
	$(BIN)/python tools/lock.py cuda $(VENV)/cuda-report.json --index "$(TORCH_INDEX)" > $(VENV)/constraints-cuda.txt
	mv $(VENV)/constraints-cuda.txt constraints-cuda.txt

# Horovod 0.28.1 from the PyPI sdist (sha256-checked) with C++17 in the three places torch >= 2.1
# needs it (kernels/engines/horovod.py says which and why); Gloo and MPI here, NCCL where CUDA is.
HOROVOD_STAMP := $(VENV)/.horovod
horovod: $(HOROVOD_STAMP)
$(HOROVOD_STAMP): $(STAMP)
	$(BIN)/python -m kernels.engines.horovod build
	touch $@

# The tiers (tests/tiers.py): unit (in-process), integration (ranks, Papermill), system (Slurm, LaTeX, MPI,
# Horovod). `make test` runs all three on TEST_WORKERS workers (tests/schedule.py keeps each shared fixture on
# one worker) and writes where the time went into tests/DURATIONS.md and README.md's test section.
TEST_WORKERS ?= 2
test: setup horovod
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations-table tests/DURATIONS.md --durations-readme

test-quick: setup
	$(BIN)/python -m pytest -q -m unit

# The fault-injection suite (needs root and the local Slurm, as make test), then its table into docs/reliability.md.
reliability: setup
	$(BIN)/python -m pytest -q -m faults
	$(BIN)/python tests/reliability_table.py

bench: setup
	$(BIN)/python benchmarks/bench_notebook.py
	$(BIN)/python benchmarks/bench_seed.py
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_io.py
	$(BIN)/python benchmarks/bench_dcrnn.py
	$(BIN)/python benchmarks/dcrnn_accuracy.py
	$(BIN)/python benchmarks/bench_comm.py
	$(BIN)/python benchmarks/bench_mpi_libraries.py
	$(BIN)/python benchmarks/bench_summary.py

# On a GPU node: everything that needs a GPU, into results/bench/<gpu-name>.md (about 10 minutes on one H100 node).
bench-gpu: setup
	PYTHON=$(BIN)/python bash benchmarks/gpu_validation.sh

# The main job, offline and on CPU: notebooks/01_train through Papermill for 1
# and 2 processes on the embedded digits, then notebooks/02_profile on 2 (traces, breakdown, verdict). A narrow ResNet-18 (width 16, same
# topology) so it takes seconds on a laptop; the product default is width 64.
# Executed notebooks and their HTML land beside the run records in results/runs/.
# The demo compares ranks, not thread counts: every rank runs DEMO_THREADS OpenMP threads at every scale (on
# 2 cores, 1 rank uses one and 2 ranks use both). One rank with two threads against two ranks with one each
# measured threads, and beside other work a two-thread rank waits for the busy core at every step.
# A training run that other work shared the cores with is run again after the other scale, DEMO_RERUNS times at most
# (kernels/notebook/demo.py): a quiet re-run measures the point, and the analysis leaves the contended one out.
DEMO_P := -p dataset digits -p epochs 3 -p batch 64 -p lr 0.05 -p width 16 -p precision fp32 -p label demo
DEMO_THREADS ?= $(or $(OMP_NUM_THREADS),1)
# Each rank on its own share of the cores (the local launcher's LAB_CPU_BIND=cores), so ranks do not migrate over
# each other's cores; DEMO_BIND=none leaves them to the scheduler.
DEMO_BIND ?= cores
DEMO_RERUNS ?= 1
demo: setup
	OMP_NUM_THREADS=$(DEMO_THREADS) LAB_CPU_BIND=$(DEMO_BIND) $(BIN)/python -m kernels.notebook.demo --reruns $(DEMO_RERUNS) $(DEMO_P)

# Regenerate 01_train's parameters cell from kernels/base/params.py and the .ipynb
# twins from the py:percent sources (the .py is always the source).
notebooks: setup
	$(BIN)/lab notebooks sync

# ---- documents: records -> analysis notebook -> figures/tables/sentences -> PDFs.
# `lab paper` decides what to rebuild from content fingerprints (records, plan, code,
# tables, figures), builds LaTeX in a clean temporary directory, and handles paths
# with spaces. RESULTS holds runs/; SYSTEM and STUDY override paper/plan.yaml.
RESULTS    ?= $(or $(LAB_RESULTS),results)
SYSTEM     ?=
STUDY      ?=
PAPER_OUT  ?= paper/build
SLIDES_OUT ?= slides/build
# APPENDIX=no: the paper without its appendix of detail tables (a conference's 6 pages)
APPENDIX   ?= yes

paper: setup
	$(BIN)/lab paper --results "$(RESULTS)" --system "$(SYSTEM)" --study "$(STUDY)" \
		--paper-out "$(PAPER_OUT)" --slides-out "$(SLIDES_OUT)" $(if $(filter no,$(APPENDIX)),--no-appendix)

# JupyterLab on this repository; notebooks/*.py open as notebooks (jupytext).
lab: setup
	$(BIN)/lab jupyter

records-doc: setup
	$(BIN)/lab records-doc > results/README.md

clean-venv:
	rm -rf $(VENV)
