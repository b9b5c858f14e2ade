# All set-up goes through here: every target installs what it needs first.
# With a virtual environment active, that one is used; otherwise ./.venv is created.
ifdef VIRTUAL_ENV
ENV_DIR := $(VIRTUAL_ENV)
else
ENV_DIR := .venv
endif
PYTHON := $(ENV_DIR)/bin/python
STAMP := $(ENV_DIR)/.bert-packed-installed

.PHONY: setup run test benchmark-packing clean

setup: $(STAMP)

$(STAMP): setup.py
	test -x $(PYTHON) || python3 -m venv $(ENV_DIR)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[cpu,test]'
	touch $(STAMP)

# The main job.
run: $(STAMP)
	$(PYTHON) -m bert_packed.packing --histogram data/histograms/wikipedia_like_512.json \
		--algorithm all --max-sequences-per-pack 3

test: $(STAMP)
	$(PYTHON) -m pytest -q tests

benchmark-packing: $(STAMP)
	$(PYTHON) scripts/benchmark_packing.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache .hypothesis
