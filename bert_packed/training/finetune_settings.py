"""The fine-tuning commands' settings: google-research/bert's run_classifier.py and run_squad.py
flags, with their defaults and meanings, and how the examples are packed.

  FineTuningSettings   what both take: the model, the schedule, the packing, the run, and the parts
                       pre-training's settings compose too (config.ComputeSettings: --precision,
                       --xla, --recompute; launch.DistributionSettings: --num_gpus,
                       --distribution_strategy, the Slurm and TF_CONFIG launch)
  ClassifierSettings   run_classifier's task (GLUE's, or JSON lines)
  SquadSettings        run_squad's files, windows and answers
"""

from __future__ import annotations

import dataclasses
import math

from bert_packed.errors import SettingsError
from bert_packed.finetuning.tasks import TASKS
from bert_packed.packing.plan import ALGORITHMS, DEFAULT_ALGORITHM
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE
from bert_packed.settings import check_settings, require_given, setting
from bert_packed.training.config import ComputeSettings
from bert_packed.training.launch import DISTRIBUTION_GROUP, DistributionSettings

TASK_GROUP, TRAINING_GROUP, PACKING_GROUP, RUN_GROUP = "task", "training", "packing", "run"
# The commands' --help groups, in order (the parts shared with pre-training: model, distribution).
HELP_ORDER = (TASK_GROUP, TRAINING_GROUP, "model", PACKING_GROUP, RUN_GROUP, DISTRIBUTION_GROUP)
# How fine-tuning rows hold examples: several a row (the same packs every epoch, or packed anew
# each epoch), or one a row (the baseline).
FINETUNING_INPUT_MODES = ("packed", "padded", "packed_online")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FineTuningSettings(ComputeSettings, DistributionSettings):
    """What every fine-tuning command takes, checked when built."""

    vocab_file: str = setting(DEFAULT_VOCAB_FILE, "The vocabulary the BERT model was trained with.", group=TASK_GROUP)
    do_lower_case: bool = setting(True, "Lower-case the text (uncased models).", group=TASK_GROUP)
    bert_config_file: str | None = setting(None, "The BERT model's bert_config.json.", group=TRAINING_GROUP,
                                           first_run=True)
    init_checkpoint: str | None = setting(None, "Pre-trained weights: a TF1 checkpoint (google-research's, or a "
                                                "run's exported weights), a pre-training run (its directory, "
                                                "checkpoints/ or checkpoints/ckpt-N) or a Hugging Face BERT directory.",
                                          group=TRAINING_GROUP, first_run=True)
    output_dir: str | None = setting(None, "Where the run's checkpoints, logs and results go.", group=TRAINING_GROUP,
                                     first_run=True)
    do_train: bool = setting(False, "Fine-tune on the training file.", group=TRAINING_GROUP)
    train_batch_size: int = setting(32, "Examples an update (packed: the packs that hold as many on average).",
                                    group=TRAINING_GROUP)
    learning_rate: float = setting(5e-5, "AdamW's peak learning rate.", group=TRAINING_GROUP)
    num_train_epochs: float = setting(3.0, "Epochs of the training examples.", group=TRAINING_GROUP)
    warmup_proportion: float = setting(0.1, "The share of the updates the learning rate warms up over, then decays "
                                            "linearly to 0.", group=TRAINING_GROUP)
    eval_every_samples: int = setting(0, "Also evaluate every this many training examples (0: only at the end): "
                                         "the dev curve compare_curves draws.", group=TRAINING_GROUP)
    input_mode: str = setting("packed", "Several examples a row (packed, by the planner on the task's own length "
                                        "histogram; packed_online: packed anew each epoch, so that other examples "
                                        "share an update) or one a row (padded).", group=PACKING_GROUP,
                              choices=FINETUNING_INPUT_MODES)
    max_sequences_per_pack: int = setting(6, "Examples a row holds at most (packed, packed_online).",
                                          group=PACKING_GROUP)
    packing_algorithm: str = setting(DEFAULT_ALGORITHM, "The planner's algorithm (python -m bert_packed.packing): lp "
                                                        "sits at the bound (SST-2-sized lengths at L=128, depth 6: "
                                                        "about 10 s, 7% fewer rows than lpfhp's).",
                                     group=PACKING_GROUP, choices=tuple(ALGORITHMS))
    seed: int = setting(12345, "Seed for the head's initial weights, the order of the examples and dropout.",
                        group=RUN_GROUP)
    save_checkpoints_steps: int = setting(1000, "Checkpoint every this many updates (and at the end).",
                                          group=RUN_GROUP)
    iterations_per_loop: int = setting(1000, "Updates in one compiled call; logs, evaluations and checkpoints happen "
                                             "between calls (with --eval_every_samples, a call ends at each "
                                             "evaluation: at most that many examples' updates).", group=RUN_GROUP)
    export_huggingface_dir: str | None = setting(None, "At the end, the fine-tuned model as a Hugging Face "
                                                       "directory (BertForSequenceClassification, "
                                                       "BertForQuestionAnswering).", group=RUN_GROUP)

    def __post_init__(self):
        check_settings(self)
        ComputeSettings.__post_init__(self)
        DistributionSettings.__post_init__(self)
        require_given(self, "bert_config_file", "output_dir")
        for name in ("train_batch_size", "max_sequences_per_pack", "save_checkpoints_steps", "iterations_per_loop"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be at least 1")
        if not 0 <= self.seed < 2**32:  # it seeds NumPy (fine-tuning is deterministic), which takes no other
            raise SettingsError(f"--seed={self.seed}: expected 0 to 2**32 - 1")
        if self.eval_every_samples < 0:
            raise SettingsError(f"--eval_every_samples={self.eval_every_samples}: expected 0 (only at the end) or more")
        if not 0 < self.num_train_epochs < math.inf:
            raise SettingsError(f"--num_train_epochs={self.num_train_epochs}: must be above 0")
        if not 0 <= self.warmup_proportion <= 1:
            raise SettingsError(f"--warmup_proportion={self.warmup_proportion}: expected a share, in [0, 1]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierSettings(FineTuningSettings):
    """run_classifier's settings, checked when built."""

    task_name: str | None = setting(None, f"The task: {', '.join(TASKS)} (jsonl: your own, train.jsonl and dev.jsonl "
                                          f"of {{\"text\", \"text_pair\", \"label\"}} lines).", group=TASK_GROUP,
                                    first_run=True)
    data_dir: str | None = setting(None, "The task's files: GLUE's train.tsv and dev.tsv (MNLI: dev_matched.tsv).",
                                   group=TASK_GROUP, first_run=True)
    max_seq_length: int = setting(128, "Tokens a sequence keeps ([CLS] text [SEP] pair [SEP], the longer text cut "
                                       "first), and a row holds.", group=TASK_GROUP)
    do_eval: bool = setting(False, "Evaluate on the dev file (at the end of training, or the newest checkpoint).",
                            group=TRAINING_GROUP)
    eval_batch_size: int = setting(8, "Rows an evaluation batch.", group=TRAINING_GROUP)
    do_predict: bool = setting(False, "Write test_results.tsv in --output_dir: each example of the task's test file "
                                      "(GLUE's test.tsv, MNLI's test_matched.tsv; jsonl: test.jsonl, labels not "
                                      "read) and its class probabilities (a regression: its score), a line each, by "
                                      "the newest checkpoint (after training, with --do_train).", group=TRAINING_GROUP)
    predict_batch_size: int = setting(8, "Rows a prediction batch.", group=TRAINING_GROUP)

    def __post_init__(self):
        super().__post_init__()  # each value of its type first: the checks below compare them
        require_given(self, "task_name", "data_dir")
        if not (self.do_train or self.do_eval or self.do_predict):
            raise SettingsError("at least one of --do_train, --do_eval or --do_predict must be given")
        for name in ("eval_batch_size", "predict_batch_size"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be at least 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SquadSettings(FineTuningSettings):
    """run_squad's settings, checked when built."""

    train_file: str | None = setting(None, "SQuAD v1.1 JSON to train on (train-v1.1.json).", group=TASK_GROUP)
    predict_file: str | None = setting(None, "SQuAD v1.1 JSON to answer (dev-v1.1.json): predictions.json, and the "
                                             "official exact match and F1 where it holds answers.", group=TASK_GROUP)
    max_seq_length: int = setting(384, "Tokens a window keeps ([CLS] question [SEP] context [SEP]), and a row "
                                       "holds.", group=TASK_GROUP)
    doc_stride: int = setting(128, "Tokens between the starts of a context's windows.", group=TASK_GROUP)
    max_query_length: int = setting(64, "Tokens a question may have (a longer one is refused).", group=TASK_GROUP)
    do_predict: bool = setting(False, "Answer the predict file (at the end of training, or by the newest "
                                      "checkpoint).", group=TRAINING_GROUP)
    predict_batch_size: int = setting(8, "Rows a prediction batch.", group=TRAINING_GROUP)
    n_best_size: int = setting(20, "Start and end candidates a window offers, and answers nbest_predictions.json "
                                   "keeps.", group=TRAINING_GROUP)
    max_answer_length: int = setting(30, "Tokens an answer may have.", group=TRAINING_GROUP)

    def __post_init__(self):
        super().__post_init__()  # each value of its type first: the checks below compare them
        if not (self.do_train or self.do_predict):
            raise SettingsError("at least one of --do_train or --do_predict must be given")
        for flag, needed in (("train_file", self.do_train), ("predict_file", self.do_predict)):
            if needed and not getattr(self, flag):
                raise SettingsError(f"--do_{'train' if flag == 'train_file' else 'predict'} needs --{flag}")
        for name in ("predict_batch_size", "doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be at least 1")
        window = self.max_seq_length - self.max_query_length - 3
        if window < 1:
            raise SettingsError(f"--max_seq_length={self.max_seq_length} leaves no context beside a question of "
                                f"--max_query_length={self.max_query_length} and [CLS] [SEP] [SEP]")
        if self.doc_stride > window:
            raise SettingsError(f"--doc_stride={self.doc_stride}: above the {window} context tokens a window holds "
                                f"(--max_seq_length - --max_query_length - 3): windows would skip text")
