# All set-up goes through here: every target installs what it needs first.
# With a virtual environment active, that one is used; otherwise ./.venv is created.
ifdef VIRTUAL_ENV
ENV_DIR := $(VIRTUAL_ENV)
else
ENV_DIR := .venv
endif
PYTHON := $(ENV_DIR)/bin/python
STAMP := $(ENV_DIR)/.bert-packed-installed

.PHONY: setup run test benchmarks clean

setup: $(STAMP)

$(STAMP): setup.py
	test -x $(PYTHON) || python3 -m venv $(ENV_DIR)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[cpu,test]'
	touch $(STAMP)

RUN_DIR ?= runs/sample

# The main job: the shipped Wikipedia sample to packed, verified pre-training data at L=512.
# Re-running reuses finished stages.
run: $(STAMP)
	$(PYTHON) scripts/create_pretraining_data.py --input_file='data/wikipedia_sample/wiki_*' \
		--output_dir=$(RUN_DIR)/unpacked --max_seq_length=512 --max_predictions_per_seq=76 --dupe_factor=1
	$(PYTHON) scripts/pack_pretraining_data.py --input_files='$(RUN_DIR)/unpacked/part-*.tfrecord' \
		--output_dir=$(RUN_DIR)/packed --max_seq_length=512 --max_predictions_per_seq=76 \
		--max_sequences_per_pack=3 --algorithm=lp --verify
	$(PYTHON) -m bert_packed.packing --histogram $(RUN_DIR)/unpacked/histogram.json \
		--algorithm all --max-sequences-per-pack 3

test: $(STAMP)
	$(PYTHON) -m pytest -q tests

# Every figure in the README.
benchmarks: $(STAMP)
	$(PYTHON) scripts/benchmark_packing.py
	$(PYTHON) scripts/benchmark_create_pretraining_data.py
	$(PYTHON) scripts/benchmark_pack_pretraining_data.py
	$(PYTHON) scripts/benchmark_input_pipeline.py
	$(PYTHON) scripts/benchmark_model.py
	$(PYTHON) scripts/benchmark_training.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache .hypothesis
