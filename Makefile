# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PLAN   := $(VENV)/bin/plan
STAMP  := $(VENV)/.installed
ENGINES := $(VENV)/engines
ENGINES_STAMP := $(ENGINES)/.installed

.PHONY: install engines-full demo test clean

install: $(STAMP) $(ENGINES_STAMP)

# torch==2.13.0 first (a CPU build on this machine's disk); then the project, whose range
# (torch>=2.5) that build already satisfies, so pip pulls no CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	# TorchRec for recommendation models: 1.8.0 is the release that runs next to torch 2.13 on CPU
	# (1.9 needs torch 2.14). It declares the CUDA fbgemm-gpu, so the CPU build goes first and
	# torchrec itself without dependencies; then what torchrec imports.
	$(PY) -m pip install --quiet fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3 torchmetrics==1.0.3 \
		tqdm==4.70.1 pyre-extensions==0.0.32 iopath==0.1.10
	$(PY) -m pip install --quiet --no-deps torchrec==1.8.0
	touch $(STAMP)

# The engines' own parsers, which the export tests run (tests/planner/export/test_engines.py),
# each in its own folder under .venv/engines, installed without dependencies so that no other torch
# comes along (the checks run them in a subprocess with that folder on PYTHONPATH; the project
# itself never imports them). Versions: README.md, "Exports".
PIPT := $(PY) -m pip install --quiet --no-deps --target
$(ENGINES_STAMP): $(STAMP) Makefile
	rm -rf $(ENGINES)/torchtitan-0.2.2 $(ENGINES)/deepspeed-0.19.8
	$(PY) -m pip install --quiet 'setuptools>=68'  # DeepSpeed builds from source with this venv's torch
	$(PIPT) $(ENGINES)/torchtitan-0.2.2 torchtitan==0.2.2 tyro==1.0.17 docstring-parser==0.18.0 \
		typeguard==4.6.1
	DS_BUILD_OPS=0 $(PIPT) $(ENGINES)/deepspeed-0.19.8 --no-build-isolation deepspeed==0.19.8 \
		einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 psutil==7.2.2 py-cpuinfo==9.0.0 \
		pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
	touch $(ENGINES_STAMP)

# Optional, about 1.3 GB: torchtitan 0.3.0 (whose parser imports its trainer, hence triton and
# datasets) and what torchtitan's model definitions import (for the test that splits its own
# Llama by the exported module names). The tests that need them skip without them.
engines-full: $(STAMP)
	rm -rf $(ENGINES)/torchtitan-0.3.0 $(ENGINES)/torchtitan-runtime
	$(PIPT) $(ENGINES)/torchtitan-0.3.0 torchtitan==0.3.0 tyro==1.0.17 docstring-parser==0.18.0 \
		typeguard==4.6.1 spmd-types==0.2.3 torch-checkpointing==0.1.1
	$(PIPT) $(ENGINES)/torchtitan-runtime triton==3.9.0 torchdata==0.11.0 tensorboard==2.21.0 \
		datasets==4.7.0 pyarrow==26.0.1 dill==0.4.0 multiprocess==0.70.18 xxhash==3.6.0 \
		httpx==0.28.1 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1

demo: $(STAMP)
	$(PLAN) solve gpt3-175b --cluster dgx-a100-80g --nodes 128 --global-batch 1536 --seq-len 2048 -o demo-plan.json
	$(PLAN) show demo-plan.json --why tp=8

# One worker per core (pytest-xdist), each test file on one worker, so that a file's fixtures (the
# multi-process runs' shared setup) run once. On this 2-core machine, with other work running beside:
# 8 min 18 s against 15 min 16 s for one worker (2026-12-07).
test: $(STAMP) $(ENGINES_STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile

clean:
	rm -rf $(VENV) demo-plan.json .pytest_cache
