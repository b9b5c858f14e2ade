# All set-up goes through here: every target installs what it needs first.
# With a virtual environment active, that one is used; otherwise ./.venv is created.
ifdef VIRTUAL_ENV
ENV_DIR := $(VIRTUAL_ENV)
else
ENV_DIR := .venv
endif
PYTHON := $(ENV_DIR)/bin/python
STAMP := $(ENV_DIR)/.bert-packed-installed
# A TensorFlow already in the environment (the gpu extra's, a TPU VM's: any flavour) is kept: the
# rest of what training needs goes beside it, never tensorflow-cpu over the same files.
HAS_TENSORFLOW := $(shell test -x $(PYTHON) && $(PYTHON) -c "import importlib.metadata as m, sys; \
	sys.exit(not {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()} & {'tensorflow', \
	'tensorflow-cpu', 'tensorflow-gpu', 'tf-nightly', 'tensorflow-macos', 'tensorflow-tpu'})" 2>/dev/null && echo yes)
EXTRAS := $(if $(HAS_TENSORFLOW),train,cpu),test

.PHONY: setup job run experiments ablation test benchmarks clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "== installing bert-packed [$(EXTRAS)] into $(ENV_DIR)$(if $(HAS_TENSORFLOW), beside its TensorFlow,) (about 1-2 minutes, once)"
	@test -x $(PYTHON) || python3 -m venv $(ENV_DIR)
	@$(PYTHON) -m pip install --quiet --quiet --upgrade pip
	@$(PYTHON) -m pip install --quiet --quiet -e '.[$(EXTRAS)]'
	@$(PYTHON) -m pip install --quiet --quiet --no-deps keras-hub==0.32.0 'tensorflow-text==2.21.*'  # pyproject.toml: test
	@echo "== installed into $(ENV_DIR); 'source $(ENV_DIR)/bin/activate' puts its python and commands on PATH"
	@touch $(STAMP)

# The main job's two corpora, each in runs/JOB (the configs/tiny_JOB_*.cfg flagfiles name these
# paths): wikipedia_like (the default), the shipped sample's text cut to Wikipedia's length mix,
# which packs at a factor of about 2 as MLPerf's Wikipedia does; sample, the sample's long
# articles as they are, which pack at 1.2 (the long-article case of docs/experiments.md).
JOB ?= wikipedia_like
override JOB := $(strip $(JOB))
DIR := runs/$(JOB)
ifeq ($(JOB),wikipedia_like)
TEXT := $(DIR)/corpus/*.txt
INPUT_FORMAT := sentences
# Two passes over the text, each masked anew (MLPerf's recipe makes ten): 6,300 sequences, enough
# for the length histogram to be read to 0.13 in total variation.
DUPE_FACTOR := 2
else
TEXT := data/wikipedia_sample/wiki_*
INPUT_FORMAT := wikiextractor
DUPE_FACTOR := 1
endif
# One seed each for the main job; `make experiments` runs three, and two more of the baseline,
# whose seeds' range is what packed is held against.
SEEDS ?= 1
BASELINE_SEEDS ?=
CURVES ?= $(DIR)/curves.png
# Flags added to phase 1's command, to every phase-2 command (the phase-1 weights' evaluation at
# L=512 included) and to the throughput measurement:
# the README test (tests/test_readme.py) runs the main job with them to make it small.
PHASE1_FLAGS ?=
PHASE2_FLAGS ?=
THROUGHPUT_FLAGS ?=
# The phase-2 configurations compared; the first is the baseline.
PHASE2 := unpacked packed_batch_corrected packed_adjusted_betas packed_plain_betas packed_online
# The ablation of docs/experiments.md: what each packed update holds, without packing, and more.
ABLATION := ablation_packs_as_rows ablation_packed_depth1 ablation_unpacked_batch9 ablation_unpacked_batch10 \
	ablation_batch_corrected_schedule_in_sequences ablation_plain_betas_schedule_in_sequences

# The main job, as MLPerf's recipe runs: the corpus; pre-training records at L=512 and L=128 with
# the same held-out documents; a short phase 1 at L=128 whose weights start every phase-2 run;
# packing at L=512 (verified lossless); phase 2 at L=512 unpacked, packed batch-corrected, packed
# with adjusted betas, packed with plain betas, and packed on the fly, for each seed, every run
# seeing as many sequences; the packed/unpacked throughput measured alternately in one process on
# these records; and the comparison (curves PNG and table). Re-running reuses every finished
# stage. Each command says what it did in a line or a few; --verbosity=1 (in a flagfile, or on
# the command) says more.
job:
	@$(if $(filter-out 1,$(words $(JOB)))$(filter-out wikipedia_like sample,$(JOB)),\
		echo "make: JOB=$(JOB): expected wikipedia_like or sample" >&2 && exit 2,true)

run: job $(STAMP)
ifeq ($(JOB),wikipedia_like)
	@echo "== 1/9 the corpus: the sample's text cut to Wikipedia's length mix ($(DIR)/corpus)"
	@$(PYTHON) scripts/make_wikipedia_like_corpus.py --output_dir=$(DIR)/corpus
else
	@echo "== 1/9 the corpus: the sample's 121 articles as they are (data/wikipedia_sample)"
endif
	@echo "== 2/9 pre-training records at L=512 ($(DIR)/unpacked)"
	@$(PYTHON) scripts/create_pretraining_data.py --input_file='$(TEXT)' --input_format=$(INPUT_FORMAT) \
		--output_dir=$(DIR)/unpacked --max_seq_length=512 --max_predictions_per_seq=76 --dupe_factor=$(DUPE_FACTOR) \
		--eval_fraction=0.1
	@echo "== 3/9 their lengths against Wikipedia's, and packing at L=512 ($(DIR)/packed)"
	@$(PYTHON) -m bert_packed.packing --histogram=$(DIR)/unpacked/histogram.json --algorithm=lp \
		--reference_histogram=data/histograms/wikipedia_512.json
	@$(PYTHON) scripts/pack_pretraining_data.py --input_files='$(DIR)/unpacked/part-*.tfrecord' \
		--output_dir=$(DIR)/packed --max_seq_length=512 --max_predictions_per_seq=76 \
		--max_sequences_per_pack=3 --algorithm=lp --verify
	@echo "== 4/9 pre-training records at L=128 for phase 1 ($(DIR)/phase1_data)"
	@$(PYTHON) scripts/create_pretraining_data.py --input_file='$(TEXT)' --input_format=$(INPUT_FORMAT) \
		--output_dir=$(DIR)/phase1_data --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=1 \
		--eval_fraction=0.1
	@echo "== 5/9 phase 1 at L=128 ($(DIR)/phase1)"
	@$(PYTHON) run_pretraining.py --flagfile=configs/tiny_$(JOB)_phase1.cfg $(PHASE1_FLAGS)
	@echo "== 6/9 the phase-1 weights evaluated at L=512 ($(DIR)/phase1_eval)"
	@test -f $(DIR)/phase1_eval/eval_results.txt || $(PYTHON) run_pretraining.py \
		--flagfile=configs/tiny_$(JOB)_phase2.cfg --do_train=false --do_eval \
		--input_file='$(DIR)/unpacked/eval-*.tfrecord' --output_dir=$(DIR)/phase1_eval $(PHASE2_FLAGS)
	@echo "== 7/9 phase 2 at L=512: $(PHASE2); seeds $(SEEDS)$(if $(BASELINE_SEEDS),; unpacked also $(BASELINE_SEEDS))"
	@$(foreach seed,$(SEEDS),$(foreach config,$(PHASE2),\
		echo "-- $(config), seed $(seed)" && $(PYTHON) run_pretraining.py --flagfile=configs/tiny_$(JOB)_$(config).cfg \
			--seed=$(seed) --output_dir=$(DIR)/$(config)_seed$(seed) $(PHASE2_FLAGS) && )) true
	@$(foreach seed,$(BASELINE_SEEDS),\
		echo "-- unpacked, seed $(seed)" && $(PYTHON) run_pretraining.py --flagfile=configs/tiny_$(JOB)_unpacked.cfg \
			--seed=$(seed) --output_dir=$(DIR)/unpacked_seed$(seed) $(PHASE2_FLAGS) && ) true
	@echo "== 8/9 throughput, packed and unpacked alternated on these records ($(DIR)/throughput.json)"
	@test -f $(DIR)/throughput.json || $(PYTHON) scripts/benchmark_training.py --configs=tiny \
		--sample_dir=$(DIR) --modes=padded,packed --target=0 --output_json=$(DIR)/throughput.json $(THROUGHPUT_FLAGS)
	@echo "== 9/9 comparison ($(CURVES))"
	@$(PYTHON) scripts/compare_curves.py --output=$(CURVES) --accuracy=auto --throughput=$(DIR)/throughput.json \
		$(foreach seed,$(BASELINE_SEEDS),$(DIR)/unpacked_seed$(seed)) \
		$(foreach config,$(PHASE2),$(foreach seed,$(SEEDS),$(DIR)/$(config)_seed$(seed)))
	@echo "results: $(DIR)/ (curves, */train_log.jsonl, */eval_log.jsonl, phase1/model.ckpt-250, throughput.json)"

# The figure and table of docs/experiments.md: the main job with three seeds of each phase-2
# configuration and five of the baseline (JOB=sample: the long-article case).
experiments: job
	@$(MAKE) --no-print-directory run SEEDS="1 2 3" BASELINE_SEEDS="4 5" CURVES=$(DIR)/experiments.png

# The ablation of docs/experiments.md, on the long-article case (after make experiments JOB=sample):
# the sample packed at depth 1, and six more phase-2 configurations, three seeds each, held against
# the baseline's five seeds.
SAMPLE := runs/sample
ablation:
	@$(MAKE) --no-print-directory experiments JOB=sample
	@echo "== ablation 1/3: the sample packed at depth 1 ($(SAMPLE)/packed_depth1)"
	@$(PYTHON) scripts/pack_pretraining_data.py --input_files='$(SAMPLE)/unpacked/part-*.tfrecord' \
		--output_dir=$(SAMPLE)/packed_depth1 --max_seq_length=512 --max_predictions_per_seq=76 \
		--max_sequences_per_pack=1 --algorithm=lpfhp
	@echo "== ablation 2/3: $(ABLATION); seeds 1 2 3"
	@$(foreach seed,1 2 3,$(foreach config,$(ABLATION),\
		echo "-- $(config), seed $(seed)" && $(PYTHON) run_pretraining.py --flagfile=configs/$(config).cfg \
			--seed=$(seed) --output_dir=$(SAMPLE)/$(config)_seed$(seed) && )) true
	@echo "== ablation 3/3: comparison at 1,200 sequences ($(SAMPLE)/ablation.png)"
	@$(PYTHON) scripts/compare_curves.py --output=$(SAMPLE)/ablation.png --accuracy=auto --at_sequences=1200 \
		$(foreach seed,1 2 3 4 5,$(SAMPLE)/unpacked_seed$(seed)) \
		$(foreach config,packed_batch_corrected packed_plain_betas $(ABLATION),\
			$(foreach seed,1 2 3,$(SAMPLE)/$(config)_seed$(seed)))

test: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q --durations=25 tests

# Every figure in the README.
benchmarks: $(STAMP)
	$(PYTHON) scripts/benchmark_packing.py
	$(PYTHON) scripts/benchmark_online_packing.py
	$(PYTHON) scripts/benchmark_create_pretraining_data.py
	$(PYTHON) scripts/benchmark_pack_pretraining_data.py
	$(PYTHON) scripts/benchmark_input_pipeline.py
	$(PYTHON) scripts/benchmark_model.py
	$(PYTHON) scripts/benchmark_training.py
	$(PYTHON) scripts/benchmark_wikipedia_like_training.py
	$(PYTHON) scripts/benchmark_iterations_per_loop.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache .hypothesis
