# The scaling lab. `make demo` runs the main job on the embedded default data
# (no network, no GPU); `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup test bench demo clean-venv records-doc help

help:
	@echo "make demo    train ResNet-18 on the embedded digits with 1 and 2 processes (no network, no GPU)"
	@echo "make setup   create .venv with the locked dependencies (torch 2.13.0)"
	@echo "make test    run the test suite (sets up first)"
	@echo "make bench   print throughput tables (pipelines; 1 vs 2 processes)"
	@echo "make records-doc  regenerate results/README.md from kernels/records.py"

setup: $(STAMP)

# torch first, alone, so the rest cannot drag in a different torch build;
# then everything else under the lock. pip fails rather than resolve another torch.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade -c constraints.txt "torch==2.13.0" numpy
	$(BIN)/python -m pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_core.py

# The main job on the embedded default data: no network, no GPU.
# A narrow ResNet-18 (width 16, same topology) so the demo takes seconds on a
# laptop CPU; the product default is the standard width 64.
DEMO_ARGS := --dataset digits --epochs 3 --batch 64 --lr 0.05 --width 16 --precision fp32 --label demo
demo: setup
	$(BIN)/python -m kernels.train $(DEMO_ARGS) --gpus 1
	$(BIN)/python -m kernels.train $(DEMO_ARGS) --gpus 2

records-doc: setup
	$(BIN)/python -m kernels.records > results/README.md

clean-venv:
	rm -rf $(VENV)
