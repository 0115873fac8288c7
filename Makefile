# The scaling lab. `make demo` runs the main job on the embedded default data
# (no network, no GPU); `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup test bench demo notebooks paper clean-venv records-doc help

help:
	@echo "make demo    run notebooks/01_train via papermill, 1 and 2 processes, embedded digits (no network, no GPU)"
	@echo "make notebooks  regenerate the parameters cell and the .ipynb twins of notebooks/*.py"
	@echo "make paper   analyse the records, then build the paper, the EuroHPC proposal and the slides"
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
# The main job, offline and on CPU: notebooks/01_train through Papermill for 1
# and 2 processes on the embedded digits. A narrow ResNet-18 (width 16, same
# topology) so it takes seconds on a laptop; the product default is width 64.
# Executed notebooks and their HTML land beside the run records in results/runs/.
DEMO_P := -p dataset digits -p epochs 3 -p batch 64 -p lr 0.05 -p width 16 -p precision fp32 -p label demo
demo: setup
	$(BIN)/python -m kernels.notebooks run notebooks/01_train.ipynb -p gpus 1 $(DEMO_P)
	$(BIN)/python -m kernels.notebooks run notebooks/01_train.ipynb -p gpus 2 $(DEMO_P)

# Regenerate 01_train's parameters cell from kernels/params.py and the .ipynb
# twins from the py:percent sources (the .py is always the source).
notebooks: setup
	$(BIN)/python -m kernels.notebooks sync

# ---- documents: records -> analysis notebook -> figures/tables/macros -> PDFs
# RESULTS holds runs/, figures/, tables/; SYSTEM overrides paper/plan.yaml's target.
RESULTS   ?= results
RUNS      ?= $(RESULTS)/runs
SYSTEM    ?=
PAPER_OUT ?= paper/build
SLIDES_OUT ?= slides/build
RECORDS := $(wildcard $(RUNS)/*/summary.json $(RUNS)/*/config.json $(RUNS)/*/metrics.csv)
TABLES  := $(RESULTS)/tables
# A deleted record must rebuild too: keep the list in a file rewritten only when it changes.
$(shell mkdir -p $(TABLES); echo '$(RECORDS) $(SYSTEM)' | cmp -s - $(TABLES)/.inputs || echo '$(RECORDS) $(SYSTEM)' > $(TABLES)/.inputs)
TEXENV  := TEXINPUTS=$(abspath $(TABLES)):$(abspath $(RESULTS)/figures): BIBINPUTS=$(abspath paper):
LATEXMK := latexmk -pdf -interaction=nonstopmode -halt-on-error -silent

$(TABLES)/.stamp: $(RECORDS) $(TABLES)/.inputs kernels/analysis.py kernels/report.py \
		notebooks/10_analyse_scaling.ipynb paper/plan.yaml paper/systems.yaml | setup
	LAB_RESULTS=$(RESULTS) $(BIN)/python -m kernels.notebooks run notebooks/10_analyse_scaling.ipynb \
		--name 10_analyse_scaling -p runs_dir $(abspath $(RUNS)) -p out_dir $(abspath $(RESULTS)) -p system "$(SYSTEM)"
	touch $@

# latexmk compares the content of every input, so an unchanged table rebuilds nothing.
$(PAPER_OUT)/%.pdf: paper/%.tex paper/refs.bib $(TABLES)/.stamp
	cd paper && $(TEXENV) $(LATEXMK) -outdir=$(abspath $(PAPER_OUT)) $*.tex

$(SLIDES_OUT)/pitch.pdf: slides/pitch.tex $(TABLES)/.stamp
	cd slides && $(TEXENV) $(LATEXMK) -outdir=$(abspath $(SLIDES_OUT)) pitch.tex

paper: $(PAPER_OUT)/paper.pdf $(PAPER_OUT)/proposal.pdf $(SLIDES_OUT)/pitch.pdf
	@echo "documents: $(PAPER_OUT)/paper.pdf $(PAPER_OUT)/proposal.pdf $(SLIDES_OUT)/pitch.pdf"

records-doc: setup
	$(BIN)/python -m kernels.records > results/README.md

clean-venv:
	rm -rf $(VENV)
