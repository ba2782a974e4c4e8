# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PLAN   := $(VENV)/bin/plan
STAMP  := $(VENV)/.installed

.PHONY: install demo test clean

install: $(STAMP)

# torch==2.13.0 first (a CPU build on this machine's disk); then the project, whose range
# (torch>=2.5) that build already satisfies, so pip pulls no CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PLAN) solve gpt3-175b --cluster dgx-a100-80g --nodes 128 --global-batch 1536 --seq-len 2048 -o demo-plan.json
	$(PLAN) show demo-plan.json

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) demo-plan.json .pytest_cache
