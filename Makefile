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

$(STAMP): pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(ENV_DIR)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[cpu,test]'
	touch $(STAMP)

RUN_DIR ?= runs/sample
# One seed each for the main job; `make run SEEDS="1 2"` adds a second pair (the README's seed noise).
SEEDS ?= 1
# Flags after --flagfile override the file's.
EVAL_FILES = --eval_files='$(RUN_DIR)/unpacked/eval-*.tfrecord'

# The main job, on the shipped Wikipedia sample at L=512: pre-training data with a held-out eval
# split by document, packing (verified lossless), a tiny BERT trained padded and packed with the
# same hyper-parameters for each seed, and the comparison (curves PNG and table, with the
# realized speed-up). Re-running reuses every finished stage.
run: $(STAMP)
	$(PYTHON) scripts/create_pretraining_data.py --input_file='data/wikipedia_sample/wiki_*' \
		--output_dir=$(RUN_DIR)/unpacked --max_seq_length=512 --max_predictions_per_seq=76 --dupe_factor=1 \
		--eval_fraction=0.1
	$(PYTHON) scripts/pack_pretraining_data.py --input_files='$(RUN_DIR)/unpacked/part-*.tfrecord' \
		--output_dir=$(RUN_DIR)/packed --max_seq_length=512 --max_predictions_per_seq=76 \
		--max_sequences_per_pack=3 --algorithm=lp --verify
	$(foreach seed,$(SEEDS),\
		$(PYTHON) run_pretraining.py --flagfile=configs/tiny_sample_padded.cfg --seed=$(seed) $(EVAL_FILES) \
			--input_files='$(RUN_DIR)/unpacked/part-*.tfrecord' --output_dir=$(RUN_DIR)/train_padded_seed$(seed) && \
		$(PYTHON) run_pretraining.py --flagfile=configs/tiny_sample_packed.cfg --seed=$(seed) $(EVAL_FILES) \
			--input_files='$(RUN_DIR)/packed/packed-*.tfrecord' --output_dir=$(RUN_DIR)/train_packed_seed$(seed) && ) true
	$(PYTHON) scripts/compare_curves.py $(foreach seed,$(SEEDS),$(RUN_DIR)/train_padded_seed$(seed)) \
		$(foreach seed,$(SEEDS),$(RUN_DIR)/train_packed_seed$(seed)) --output $(RUN_DIR)/curves.png --accuracy auto
	@echo "results: $(RUN_DIR)/ (curves.png, train_*/train_log.jsonl, eval_log.jsonl, packed/metadata.json)"

test: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q tests

# Every figure in the README.
benchmarks: $(STAMP)
	$(PYTHON) scripts/benchmark_packing.py
	$(PYTHON) scripts/benchmark_create_pretraining_data.py
	$(PYTHON) scripts/benchmark_pack_pretraining_data.py
	$(PYTHON) scripts/benchmark_input_pipeline.py
	$(PYTHON) scripts/benchmark_model.py
	$(PYTHON) scripts/benchmark_training.py
	$(PYTHON) scripts/benchmark_wikipedia_like_training.py
	$(PYTHON) scripts/benchmark_iterations_per_loop.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache .hypothesis
