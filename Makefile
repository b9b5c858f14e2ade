# All set-up goes through here: every target installs what it needs first.
# With a virtual environment active, that one is used; otherwise ./.venv is created.
ifdef VIRTUAL_ENV
ENV_DIR := $(VIRTUAL_ENV)
else
ENV_DIR := .venv
endif
PYTHON := $(ENV_DIR)/bin/python
# What is installed: the main job's needs (STAMP), then the tests' (TEST_STAMP: PyTorch's CPU
# build, transformers and keras-hub to read the Hugging Face export, Apache Beam, pytest).
# What the main job's install brings is compiled once, after it: where PYTHONDONTWRITEBYTECODE is
# set (as on this project's machines) Python never caches what it compiles, and every process
# compiled TensorFlow afresh (its import 12 s instead of 4.6 s here). pip compiles one module
# after another; --no-compile, then compileall on both cores, is faster. A module it cannot
# compile (PyTorch ships one in Python 3.12's syntax) is Python's to compile or refuse on import,
# as after pip's own. What the tests' install adds (PyTorch, transformers, JAX, Beam: most of
# site-packages' 22,000 modules, most never imported) is not: the suite caches what it imports as
# it imports it (tests/conftest.py), which took 23 s less of `make test` than compiling it all.
SITE_PACKAGES = $$($(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
STAMP := $(ENV_DIR)/.bert-packed-installed
TEST_STAMP := $(ENV_DIR)/.bert-packed-test-installed
# A TensorFlow already in the environment (the gpu extra's, a TPU VM's: any flavour) is kept: the
# rest of what training needs goes beside it, never tensorflow-cpu over the same files.
HAS_TENSORFLOW := $(shell test -x $(PYTHON) && $(PYTHON) -c "import importlib.metadata as m, sys; \
	sys.exit(not {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()} & {'tensorflow', \
	'tensorflow-cpu', 'tensorflow-gpu', 'tf-nightly', 'tensorflow-macos', 'tensorflow-tpu'})" 2>/dev/null && echo yes)
EXTRAS := $(if $(HAS_TENSORFLOW),train,cpu)

.PHONY: setup job run finetune experiments ablation test benchmarks clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "== installing bert-packed [$(EXTRAS)] into $(ENV_DIR)$(if $(HAS_TENSORFLOW), beside its TensorFlow,) (about 1-2 minutes, once)"
	@test -x $(PYTHON) || python3 -m venv $(ENV_DIR)
	@$(PYTHON) -m pip install --quiet --quiet --upgrade pip
	@$(PYTHON) -m pip install --quiet --quiet --no-compile -e '.[$(EXTRAS)]'
	@$(PYTHON) -m compileall -qq -j 0 "$(SITE_PACKAGES)" || true
	@echo "== installed into $(ENV_DIR); 'source $(ENV_DIR)/bin/activate' puts its python and commands on PATH"
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	@echo "== installing what the tests need into $(ENV_DIR): PyTorch's CPU build, transformers, keras-hub, Apache Beam (about 2 minutes, once)"
	@$(PYTHON) -m pip install --quiet --quiet --no-compile -e '.[$(EXTRAS),test]'
	@$(PYTHON) -m pip install --quiet --quiet --no-compile --no-deps keras-hub==0.32.0 'tensorflow-text==2.21.*'  # pyproject.toml: test
	@touch $(TEST_STAMP)

# The main job (scripts/main_job.py says what each stage does), its stages in one process:
# JOB=wikipedia_like (the default), the shipped sample's text cut to Wikipedia's length mix, which
# packs at a factor of about 2 as MLPerf's Wikipedia does; JOB=sample, the sample's long articles
# as they are, which pack at 1.2 (the long-article case of docs/experiments.md). Results in
# runs/JOB; re-running reuses every finished stage.
# CORPUS='my/text/*.txt.gz' (JOB=corpus), your own text in any input format: the same stages but
# phase 1, in runs/corpus, phase 2 packed against unpacked from INIT_CHECKPOINT's weights or
# random ones; VOCAB_FILE and BERT_CONFIG_FILE for a vocabulary of your own (python -m
# bert_packed.vocab writes both), DATA_FLAGS for create_pretraining_data (--input_format=jsonl).
# Taken from make's command line only: a CORPUS or an INIT_CHECKPOINT in the environment, set for
# something else, does not change what `make run` runs.
$(foreach name,CORPUS VOCAB_FILE BERT_CONFIG_FILE INIT_CHECKPOINT DATA_FLAGS,\
	$(if $(filter environment,$(origin $(name))),$(eval $(name) :=)))
JOB ?= $(if $(strip $(CORPUS)),corpus,wikipedia_like)
override JOB := $(strip $(JOB))
DIR := runs/$(JOB)
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
comma := ,
# The ablation of docs/experiments.md: what each packed update holds, without packing, and more.
ABLATION := ablation_packs_as_rows ablation_packed_depth1 ablation_unpacked_batch9 ablation_unpacked_batch10 \
	ablation_batch_corrected_schedule_in_sequences ablation_plain_betas_schedule_in_sequences

job:
	@$(if $(filter-out 1,$(words $(JOB)))$(filter-out wikipedia_like sample corpus,$(JOB)),\
		echo "make: JOB=$(JOB): expected wikipedia_like or sample (CORPUS=... runs on your own text)" >&2 && exit 2,true)
	@$(if $(filter command line,$(origin CORPUS)),$(if $(strip $(CORPUS)),true,\
		echo "make: CORPUS is empty: expected a glob of your text files (CORPUS='my/text/*.txt.gz')" >&2 && exit 2),true)

# A value as one shell word, exactly as given: in single quotes, each ' as '\''. The *_FLAGS are
# taken unexpanded ($(value ...)), so that a quote, a $ or a ; in them reaches the job as typed
# (PHASE2_FLAGS="--submission_org='My Org'"), which splits them as a shell would.
quote = '$(subst ','\'',$(1))'

run: job $(STAMP)
	@$(PYTHON) scripts/main_job.py --job=$(JOB) --seeds=$(call quote,$(subst $() ,$(comma),$(strip $(SEEDS)))) \
		--baseline_seeds=$(call quote,$(subst $() ,$(comma),$(strip $(BASELINE_SEEDS)))) \
		--curves=$(call quote,$(CURVES)) --phase1_flags=$(call quote,$(value PHASE1_FLAGS)) \
		--phase2_flags=$(call quote,$(value PHASE2_FLAGS)) --throughput_flags=$(call quote,$(value THROUGHPUT_FLAGS)) \
		$(if $(strip $(CORPUS)),--corpus=$(call quote,$(value CORPUS))) \
		$(if $(strip $(VOCAB_FILE)),--vocab_file=$(call quote,$(value VOCAB_FILE))) \
		$(if $(strip $(BERT_CONFIG_FILE)),--bert_config_file=$(call quote,$(value BERT_CONFIG_FILE))) \
		$(if $(strip $(INIT_CHECKPOINT)),--init_checkpoint=$(call quote,$(value INIT_CHECKPOINT))) \
		--data_flags=$(call quote,$(value DATA_FLAGS))

# Fine-tuning on the shipped sample, packed against padded (scripts/finetune_job.py), from the main
# job's weights (after `make run`): two tasks the sample's text labels, their dev curves and the
# throughput measured alternately, in runs/finetune. FINETUNE_FLAGS: flags added to its command.
FINETUNE_FLAGS ?=
finetune: $(STAMP)
	@$(PYTHON) scripts/finetune_job.py $(FINETUNE_FLAGS)

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

test: $(TEST_STAMP)
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
	$(PYTHON) scripts/benchmark_optimizer.py
	$(PYTHON) scripts/benchmark_iterations_per_loop.py
	$(PYTHON) scripts/benchmark_signal_at_evaluation.py
	$(PYTHON) scripts/benchmark_finetuning.py
	$(PYTHON) scripts/benchmark_peers.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache .hypothesis
