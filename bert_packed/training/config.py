"""A training run's settings, in the parts a reader thinks in: model, batch, optimizer, evaluation, run.

One name per setting: every field is named after the run_pretraining flag that sets it, so that
  - the command line fills the parts by name (`make_config(**{name: FLAGS[name].value})`),
  - run.json records the run's identity by the same names (`TrainConfig.identity`), and a run
    restarted with another value of a field is refused, unless the field is `changeable` (a
    setting that does not change what is trained, or may change on purpose, as
    --num_train_steps does when a run goes on past its end),
  - a test or a benchmark sets a field by its flag's name (`make_config(train_batch_size=4, ...)`).
A new setting is written once: a field here, declared with bert_packed.settings.setting (its
default, its help, its group in --help, the reference's default where it differs; its check in
the part's __post_init__). run_pretraining's flags are made from these fields, and from
LaunchSettings's and launch.DistributionSettings's, which a run's identity leaves out.

Each part checks its own values when it is built: a value that cannot work is a SettingsError
naming its flag. The defaults are written once, here; the flags take theirs from these classes.

What the data is (files, shapes, packing factor, the plan's strategies) is not a setting:
bert_packed.training.data describes it, and `batching()` combines the two into what one update
holds (the corrected batch, the betas); `eval_every_samples()` resolves the MLPerf eval cadence.

Step counts are the MLPerf reference's: micro-steps. One update is `steps_per_update` micro-steps,
each a micro-batch of `rows_per_micro_batch` rows (all replicas together), so a run of
num_train_steps makes num_train_steps // steps_per_update updates (docs/training.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math

from bert_packed.errors import SettingsError
from bert_packed.features import EVAL_INPUT_MODES, INPUT_MODES, PACK_MODES
from bert_packed.model.config import RECOMPUTE, BertConfig
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE
from bert_packed.settings import check_settings, setting

# Sequences the on-the-fly packer may hold at once: on the real Wikipedia-512 lengths at depth 3 it
# then packs as efficiently as the offline LP (docs/packing.md#packing-on-the-fly).
ONLINE_PACKING_WINDOW = 30_000
# Each sequence held costs its row (about 2.5 KB at L=512), and a window of 30,000 already packs
# within 0.001 points of the offline plan (docs/packing.md).
MAX_ONLINE_PACKING_WINDOW = 1_000_000
# The MLM loss's basis (bert_packed.training.losses): over all predictions (MLPerf) or per sequence.
LOSS_AVERAGING = ("token", "sequence")
# --precision -> the Keras mixed-precision policy (fp16 with dynamic loss scaling).
PRECISIONS = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
OPTIMIZERS = ("lamb", "adamw")
DIVISIONS = ("closed", "open")
STATUSES = ("onprem", "cloud", "preview", "research")
# --help's groups that are not one part's.
RUN_GROUP = "run, checkpoints and logs"
MLPERF_GROUP = "MLPerf logging"


def require(condition: bool, message: str) -> None:
    """Raises SettingsError(message) unless `condition` holds."""
    if not condition:
        raise SettingsError(message)


def require_packed_for(input_mode: str, **settings: bool) -> None:
    """Raises SettingsError when a setting that only packed data has (given by its flag's name)
    is on and the input is not read as packs."""
    for name, on in settings.items():
        require(not on or input_mode in PACK_MODES, f"--{name} needs packed data, not --input_mode={input_mode}")


def require_fits(max_seq_length: int, bert: BertConfig) -> None:
    """Raises SettingsError when sequences of max_seq_length do not fit the model's positions."""
    require(max_seq_length <= bert.max_position_embeddings, f"--max_seq_length={max_seq_length} exceeds "
                                                            f"max_position_embeddings={bert.max_position_embeddings} "
                                                            f"of the BERT config")


def require_divides(flag: str, rows: int, num_replicas: int) -> None:
    """Raises SettingsError unless `rows` (given by `flag`) share evenly among the replicas."""
    require(rows % num_replicas == 0, f"{flag}={rows} rows do not divide among the {num_replicas} replicas: use a "
                                      f"multiple of {num_replicas}")


def require_window(window: int, depth: int) -> None:
    require(depth <= window <= MAX_ONLINE_PACKING_WINDOW,
            f"--online_packing_window={window}: at least --max_sequences_per_pack={depth} and at most "
            f"{MAX_ONLINE_PACKING_WINDOW:,} sequences (each held sequence costs memory; {ONLINE_PACKING_WINDOW:,} "
            f"packs within 0.001 points of the offline plan)")


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value (and >= multiple).

    >>> round_up(5, 2), round_up(4, 2), round_up(1, 3)
    (6, 4, 3)
    """
    return max(multiple, -(-value // multiple) * multiple)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ComputeSettings:
    """How the model computes: the part pre-training (ModelConfig) and fine-tuning
    (training.finetune_settings) share, so that a way of computing lands once for both.

    Attributes:
      precision: "fp32", "bf16" or "fp16" (fp16 with dynamic loss scaling).
      xla: compile the forward and backward pass, and each weight's optimizer step, with XLA.
      recompute: what the backward pass recomputes instead of keeping (model.RECOMPUTE: none,
        attention, layer): the same gradients in less memory, so a run may change it on resume.
    """

    precision: str = setting("fp32", "fp16 uses dynamic loss scaling.", group="model", choices=tuple(PRECISIONS))
    xla: bool = setting(False, "Compile the forward and backward pass, and each weight's optimizer step, with XLA.",
                        group="model")
    recompute: str = setting(
        "none", "What the backward pass recomputes instead of keeping: none; attention (scores, softmax, dropout, "
                "probabilities x values: most of a row's memory at L=512); layer (each whole transformer layer). The "
                "same gradients in less memory, at the cost of time (docs/launch.md#memory).",
        group="model", changeable=True, choices=RECOMPUTE)

    def __post_init__(self):
        check_settings(self, ComputeSettings)
        require(self.recompute in RECOMPUTE, f"--recompute={self.recompute}: expected one of {', '.join(RECOMPUTE)}")
        require(self.precision in PRECISIONS, f"--precision={self.precision}: expected one of {', '.join(PRECISIONS)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(ComputeSettings):
    """The model and how it computes (ComputeSettings: precision, xla, recompute).

    Attributes:
      bert: the BERT hyper-parameters (--bert_config_file).
      init_checkpoint: a google-research/MLPerf TF1 checkpoint to start from (None: random); read
        only by a run's first start.
      loss_averaging: the MLM loss basis, "token" (MLPerf) or "sequence" (docs/model.md).
      nsp_loss: the next-sentence head and its loss; False: masked-LM only (RoBERTa's objective,
        Graphcore's MLPerf packed configs), the MLPerf metric unchanged.
    """

    bert: BertConfig
    init_checkpoint: str | None = setting(
        None, "Weights to start from: a google-research/MLPerf TF1 checkpoint, a pre-training run (its directory, "
              "checkpoints/ or checkpoints/ckpt-N), or a Hugging Face BERT directory (config.json, model.safetensors).",
        group="model", changeable=True, first_run=True)
    loss_averaging: str = setting("token", "MLM loss basis.", group="model", choices=LOSS_AVERAGING)
    nsp_loss: bool = setting(True, "Train the next-sentence head on its loss; --nsp_loss=false: masked-LM only, no "
                                   "NSP head (RoBERTa's objective; the MLPerf metric, MLM accuracy, is unchanged).",
                             group="model")

    def __post_init__(self):
        super().__post_init__()
        require(self.loss_averaging in LOSS_AVERAGING,
                f"--loss_averaging={self.loss_averaging}: expected one of {', '.join(LOSS_AVERAGING)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """How the training data is read and how much of it one update takes.

    Attributes:
      input_mode: one of INPUT_MODES; None: as the data's metadata.json says (packed or padded).
      train_batch_size: rows per micro-batch, all replicas: packs when packed, unpacked rows with
        adjust_batch_for_packing.
      adjust_batch_for_packing: batch correction: a micro-batch takes as many packs as hold
        train_batch_size unpacked rows' sequences on average.
      steps_per_update: micro-batches accumulated into one update.
      bucket_boundaries: with "bucketed", the lengths batches are trimmed to.
      online_packing_window: with "packed_online", sequences the packer may hold at once (part of
        the run's identity then: training.loop adds it; for other modes it reads nothing).
    """

    input_mode: str | None = setting(
        None, "How the training data is read (default: packed when its metadata.json says packed, else padded, as "
              "the reference reads it); packed_online packs unpacked records as they are read.",
        group="data", choices=INPUT_MODES)
    train_batch_size: int = setting(
        8, "Rows per micro-batch, all replicas: packs when packed, unpacked rows with --adjust_batch_for_packing.",
        group="batch and schedule", reference_default=32, first_run=True)
    adjust_batch_for_packing: bool = setting(
        False, "Batch correction: --train_batch_size counts unpacked rows, and a micro-batch takes round("
               "train_batch_size / packing factor) packs (the packing factor of the data's metadata.json), so that an "
               "update holds on average as many sequences as unpacked.", group="batch and schedule")
    steps_per_update: int = setting(1, "Micro-batches accumulated into one update.", group="batch and schedule")
    bucket_boundaries: tuple[int, ...] = setting((), "Lengths batches are trimmed to in bucketed mode.", group="data")
    online_packing_window: int = setting(
        ONLINE_PACKING_WINDOW, "With --input_mode=packed_online (or --eval_input_mode): sequences the packer may hold "
                               "at once.", group="data", changeable=True)

    def __post_init__(self):
        require(self.input_mode is None or self.input_mode in INPUT_MODES,
                f"--input_mode={self.input_mode}: expected one of {', '.join(INPUT_MODES)}")
        require(self.train_batch_size >= 1, f"--train_batch_size={self.train_batch_size}: must be >= 1")
        require(self.steps_per_update >= 1, f"--steps_per_update={self.steps_per_update}: must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer and its learning-rate schedule (docs/training.md).

    Attributes:
      optimizer: "lamb" (MLPerf) or "adamw" (original BERT).
      learning_rate: the peak learning rate.
      num_train_steps: micro-steps in the run (the schedule decays to 0 there).
      num_warmup_steps: linear warmup micro-steps.
      start_warmup_step: the warmup's origin (negative: start partway through it).
      poly_power: the power of the polynomial decay.
      lamb_beta_1, lamb_beta_2: the moment decays before any packing adjustment.
      lamb_weight_decay_rate: decoupled weight decay inside the update.
      epsilon: added to the second moment's root (the reference's --log_epsilon is its log10).
      adjust_betas_for_packing: raise both betas to the power of the data's packing factor.
      clip_by_global_norm_after_gradient_allreduce: clip the gradient of the whole update (summed
        over micro-batches and replicas); False (the reference's default): clip each replica's
        gradient of each micro-batch, then average them.
    """

    optimizer: str = setting("lamb", "LAMB (MLPerf) or AdamW (original BERT).", group="optimizer",
                             reference_default="adamw", choices=OPTIMIZERS)
    learning_rate: float = setting(4.25e-4, "Peak learning rate.", group="batch and schedule", reference_default="5e-5",
                                   first_run=True)
    num_train_steps: int = setting(100, "Micro-steps; updates are num_train_steps // steps_per_update.",
                                   group="batch and schedule", changeable=True, reference_default=100000,
                                   first_run=True)
    num_warmup_steps: int = setting(0, "Linear warmup micro-steps.", group="batch and schedule",
                                    reference_default=10000)
    start_warmup_step: int = setting(0, "Warmup origin in micro-steps (negative: start partway through).",
                                     group="batch and schedule")
    poly_power: float = setting(1.0, "Power of the polynomial learning-rate decay.", group="batch and schedule")
    lamb_beta_1: float = setting(0.9, "beta_1 (before any packing adjustment).", group="optimizer")
    lamb_beta_2: float = setting(0.999, "beta_2 (before any packing adjustment).", group="optimizer")
    lamb_weight_decay_rate: float = setting(0.01, "Weight decay inside the update.", group="optimizer")
    epsilon: float = setting(1e-6, "Optimizer epsilon (= 10**--log_epsilon).", group="optimizer")
    adjust_betas_for_packing: bool = setting(False, "Raise the betas to the power of the packing factor.",
                                             group="optimizer")
    clip_by_global_norm_after_gradient_allreduce: bool = setting(
        False, "Clip the gradient of the whole update (summed over replicas and micro-batches) to norm 1; default, as "
               "the reference: clip each replica's gradient of each micro-batch, then average.", group="optimizer")

    def __post_init__(self):
        require(self.optimizer in OPTIMIZERS, f"--optimizer={self.optimizer}: expected one of {', '.join(OPTIMIZERS)}")
        require(finite(self.learning_rate) and self.learning_rate >= 0,
                f"--learning_rate={self.learning_rate}: must be a number >= 0")
        require(self.num_train_steps >= 1, f"--num_train_steps={self.num_train_steps}: must be >= 1")
        require(self.num_warmup_steps >= 0, f"--num_warmup_steps={self.num_warmup_steps}: must be >= 0")
        require(self.num_warmup_steps <= self.num_train_steps,
                f"--num_warmup_steps={self.num_warmup_steps} exceeds --num_train_steps={self.num_train_steps}")
        require(finite(self.poly_power) and self.poly_power >= 0, f"--poly_power={self.poly_power}: must be >= 0")
        for name in ("lamb_beta_1", "lamb_beta_2"):
            value = getattr(self, name)
            require(finite(value) and 0.0 <= value < 1.0, f"--{name}={value}: must be in [0, 1)")
        require(finite(self.lamb_weight_decay_rate) and self.lamb_weight_decay_rate >= 0,
                f"--lamb_weight_decay_rate={self.lamb_weight_decay_rate}: must be >= 0")
        require(finite(self.epsilon) and self.epsilon > 0, f"--epsilon={self.epsilon}: must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How the eval data is read and when (packed or unpacked records give the same figures).

    Attributes:
      eval_input_mode: one of EVAL_INPUT_MODES; None: as the eval data's metadata.json says.
      eval_batch_size: rows per eval batch, all replicas.
      eval_every_samples: evaluate every this many training sequences; -1: the MLPerf cadence; 0:
        only at the end.
      target_mlm_accuracy: stop when an evaluation reaches this masked-LM accuracy.
      max_eval_steps: evaluate at most this many batches (None: the whole set).
    """

    eval_input_mode: str | None = setting(  # packed or unpacked eval records give the same figures
        None, "How the eval files are read (default: as their metadata.json says); packed_online packs unpacked eval "
              "records as they are read, each once.", group="data", changeable=True, choices=EVAL_INPUT_MODES)
    eval_batch_size: int = setting(8, "Rows per eval batch, all replicas.", group="evaluation")
    eval_every_samples: int = setting(-1, "Evaluate every this many sequences; -1: the MLPerf cadence; 0: once at the "
                                          "end.", group="evaluation")
    target_mlm_accuracy: float = setting(0.720, "Stop when evaluation reaches this masked-LM accuracy.",
                                         group="evaluation")
    max_eval_steps: int | None = setting(None, "Evaluate at most this many batches (default: the whole eval set).",
                                         group="evaluation", reference_default=100)

    def __post_init__(self):
        require(self.eval_input_mode is None or self.eval_input_mode in EVAL_INPUT_MODES,
                f"--eval_input_mode={self.eval_input_mode}: expected {', '.join(EVAL_INPUT_MODES)}")
        require(self.eval_batch_size >= 1, f"--eval_batch_size={self.eval_batch_size}: must be >= 1")
        require(self.eval_every_samples >= -1, f"--eval_every_samples={self.eval_every_samples}: must be >= -1 (-1: "
                                               f"the MLPerf cadence, 0: only at the end)")
        require(finite(self.target_mlm_accuracy) and 0.0 <= self.target_mlm_accuracy <= 1.0,
                f"--target_mlm_accuracy={self.target_mlm_accuracy}: must be in [0, 1]")
        require(self.max_eval_steps is None or self.max_eval_steps >= 1,
                f"--max_eval_steps={self.max_eval_steps}: must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where the run writes, how it seeds, how often it saves and reports, and what mllog.txt says
    of the submission.

    Attributes:
      output_dir: logs, checkpoints and TensorBoard; a run restarted here resumes.
      seed: seeds initialisation, data order and dropout.
      deterministic: the same configuration gives the same results (op determinism).
      save_checkpoints_steps: checkpoint every this many micro-steps (and at the end).
      keep_checkpoint_max: checkpoints kept (older ones are deleted).
      iterations_per_loop: micro-steps run in one compiled call, without host reads; logs,
        checkpoints and evaluations happen between calls.
      log_every_steps: a progress line every this many micro-steps.
      start_over_if_no_checkpoint_restores: when the run's checkpoints are there and none
        restores, train from step 0 (emptying the logs) instead of stopping.
      submission_org, submission_platform, submission_division, submission_status: the MLPerf
        submission fields of mllog.txt.
      flags_text: the command line that started the run, recorded in flags.txt once the output
        directory is claimed (no flag: the command fills it).
      export_huggingface_dir: when the run finishes, its weights are also written there as a
        Hugging Face BERT directory ("": not), with the tokenizer of vocab_file and do_lower_case.
    """

    output_dir: str | None = setting(None, "Logs, checkpoints, TensorBoard; a run restarted here resumes.",
                                     group=RUN_GROUP, changeable=True, first_run=True)
    seed: int = setting(12345, "Seed for initialisation, data order and dropout.", group=RUN_GROUP)
    deterministic: bool = setting(
        False, "Same flags, same results (op determinism, fixed data order): bit-equal on a CPU (tested); on a GPU "
               "not yet shown (scripts/device_check.py checks it; docs/training.md#determinism).",
        group=RUN_GROUP, changeable=True)
    save_checkpoints_steps: int = setting(1000, "Checkpoint every this many micro-steps (and at the end), rounded up "
                                                "to whole compiled loops.", group=RUN_GROUP, changeable=True)
    keep_checkpoint_max: int = setting(5, "Checkpoints kept.", group=RUN_GROUP, changeable=True)
    iterations_per_loop: int = setting(
        1, "Micro-steps in one compiled call, no host reads inside; logs, checkpoints and evaluations happen between "
           "calls.", group=RUN_GROUP, changeable=True, reference_default=1000)
    log_every_steps: int = setting(10, "Progress line every this many micro-steps.", group=RUN_GROUP, changeable=True)
    start_over_if_no_checkpoint_restores: bool = setting(
        False, "When --output_dir holds checkpoints and none restores, train from step 0, emptying the run's logs; "
               "without it the run stops, naming them (a storage error may pass: run again first).",
        group=RUN_GROUP, changeable=True)
    submission_org: str = setting("unsubmitted", "MLPerf submission_org in mllog.txt.", group=MLPERF_GROUP,
                                  changeable=True)
    submission_platform: str = setting("unsubmitted", "MLPerf submission_platform in mllog.txt.", group=MLPERF_GROUP,
                                       changeable=True)
    submission_division: str = setting("closed", "MLPerf submission_division.", group=MLPERF_GROUP, changeable=True,
                                       choices=DIVISIONS)
    submission_status: str = setting("onprem", "MLPerf submission_status.", group=MLPERF_GROUP, changeable=True,
                                     choices=STATUSES)
    flags_text: str = dataclasses.field(default="", metadata={"changeable": True})  # the command fills it
    export_huggingface_dir: str = setting(
        "", "When the run finishes, also write its weights there as a Hugging Face BERT directory "
            "(scripts/export_model.py does it for any run).", group=RUN_GROUP, changeable=True)
    vocab_file: str = setting(DEFAULT_VOCAB_FILE, "The vocabulary of the data, for --export_huggingface_dir's "
                                                  "tokenizer.", group=RUN_GROUP, changeable=True)
    do_lower_case: bool = setting(True, "The data was lower-cased (uncased), for --export_huggingface_dir's "
                                        "tokenizer.", group=RUN_GROUP, changeable=True)

    def __post_init__(self):
        require(bool(self.output_dir), "--output_dir is required")
        require("://" not in self.output_dir or not any(c in self.output_dir for c in "[]*?{"),
                f"--output_dir={self.output_dir}: TensorFlow cannot read a checkpoint whose remote path holds [, ], *, "
                f"? or {{, so the run could never resume; name it without them")
        require(0 <= self.seed < 2**63, f"--seed={self.seed}: must be >= 0 and below 2**63")
        require(self.seed < 2**32 or not self.deterministic,
                f"--seed={self.seed}: with --deterministic, below 2**32 (it seeds NumPy, which takes no larger seed)")
        for flag in ("save_checkpoints_steps", "keep_checkpoint_max", "iterations_per_loop", "log_every_steps"):
            require(getattr(self, flag) >= 1, f"--{flag}={getattr(self, flag)}: must be >= 1")
        require(self.submission_division in DIVISIONS,
                f"--submission_division={self.submission_division}: expected closed or open")
        require(self.submission_status in STATUSES,
                f"--submission_status={self.submission_status}: expected one of {', '.join(STATUSES)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """What run_pretraining's settings hold besides the run's parts and its distribution
    (launch.DistributionSettings): the BERT config and the data files, what to do, and the
    reference's second spellings. None of it is part of a run's identity. The data's own
    description says the rest (bert_packed.training.assemble)."""

    bert_config_file: str | None = setting(None, "google-research bert_config.json.", group="model", first_run=True)
    input_file: str | None = setting(None, "Comma-separated globs of training TFRecords (the reference's name of "
                                           "--input_files). With --do_eval alone: the eval set, unless --eval_files names it.",
                                     group="data")
    input_files: str | None = setting(None, "Comma-separated globs of training TFRecords (= --input_file).",
                                      group="data", first_run=True)
    eval_files: str | None = setting(None, "Comma-separated globs of evaluation TFRecords (packed or unpacked).",
                                     group="data", first_run=True)
    max_seq_length: int = setting(512, "L of the data (default: as the training data's metadata.json records, the "
                                       "eval set's with --do_train=false, else --input_file's, else 512).",
                                  group="data", reference_default=128, first_run=True)
    max_predictions_per_seq: int = setting(76, "P of the data; packs hold P + S (default: as metadata.json records, "
                                               "else 76).", group="data", reference_default=20, first_run=True)
    max_sequences_per_pack: int = setting(3, "S of packed training data, checked against its metadata.json when given "
                                             "(ignored for padded/bucketed).", group="data")
    train_on_held_out_files: bool = setting(
        False, "Let --input_file name a dataset's held-out evaluation files (eval-*.tfrecord of "
               "create_pretraining_data --eval_fraction), which are otherwise refused as training input.", group="data")
    do_train: bool = setting(True, "Train (the reference's runs give both do_*).", group="evaluation",
                             reference_default=False)
    do_eval: bool = setting(False, "Evaluate: alone, once, the latest checkpoint of --output_dir or --init_checkpoint; "
                                   "with --do_train, during training, on --eval_files or else on --input_file.",
                            group="evaluation")
    log_epsilon: float = setting(math.log10(OptimizerConfig.epsilon), "Optimizer epsilon is 10**log_epsilon (or give "
                                                                      "--epsilon).", group="optimizer")


# The parts of a TrainConfig, by attribute.
PARTS = {"model": ModelConfig, "batch": BatchConfig, "optimizer": OptimizerConfig, "eval": EvalConfig,
         "run": RunConfig}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Every setting of a run, in its parts, checked together where no part can alone."""

    model: ModelConfig
    batch: BatchConfig
    optimizer: OptimizerConfig
    eval: EvalConfig
    run: RunConfig

    def __post_init__(self):
        n, steps = self.batch.steps_per_update, self.optimizer.num_train_steps
        require(steps >= n, f"--num_train_steps={steps} is less than one update of --steps_per_update={n} micro-steps")

    def identity(self) -> dict:
        """The settings a resumed run must share with the run it resumes, by name: every field of
        every part but the changeable ones (the BERT config as its JSON keys)."""
        identity = {}
        for part in PARTS:
            value = getattr(self, part)
            for field in dataclasses.fields(value):
                if not field.metadata.get("changeable"):
                    setting = getattr(value, field.name)
                    identity[field.name] = setting.to_dict() if isinstance(setting, BertConfig) else setting
        identity["bucket_boundaries"] = list(identity["bucket_boundaries"])  # as JSON gives it back
        return identity

    @functools.cached_property
    def last_step(self) -> int:
        """The micro-step the run ends at: whole updates only."""
        n = self.batch.steps_per_update
        return self.optimizer.num_train_steps // n * n

    @functools.cached_property
    def loop_steps(self) -> int:
        """Micro-steps in one compiled call: iterations_per_loop rounded up to whole updates."""
        return round_up(self.run.iterations_per_loop, self.batch.steps_per_update)

    @functools.cached_property
    def save_steps(self) -> int:
        """Micro-steps between checkpoints: save_checkpoints_steps rounded up to whole loops."""
        return round_up(self.run.save_checkpoints_steps, self.loop_steps)

    def rounding_notes(self, evaluates: bool) -> list[str]:
        """What the cadences round, in words: micro-step counts that do not fall on whole updates
        or compiled loops round up, as on the reference's TPU (checkpoints and evaluations only
        between loops)."""
        n, run, steps = self.batch.steps_per_update, self.run, self.optimizer.num_train_steps
        notes = []
        if steps % n:
            notes.append(f"--num_train_steps={steps} is not a multiple of --steps_per_update={n}: the last {steps % n} "
                         f"micro-steps make no update and are not run")
        if self.loop_steps != run.iterations_per_loop:
            notes.append(f"--iterations_per_loop={run.iterations_per_loop} rounds up to {self.loop_steps}, whole "
                         f"updates of --steps_per_update={n}")
        if self.save_steps != run.save_checkpoints_steps:
            notes.append(f"--save_checkpoints_steps={run.save_checkpoints_steps} is not a multiple of the loop of "
                         f"{self.loop_steps} micro-steps: checkpoints every {self.save_steps}")
        if self.loop_steps > 1 and evaluates and self.eval.eval_every_samples:  # 0: once, at the end
            notes.append(f"evaluations happen between compiled loops of {self.loop_steps} micro-steps: each at the "
                         f"first loop end after its cadence")
        return notes


def setting_names() -> dict[str, str]:
    """Every setting's name -> the part that holds it."""
    return {field.name: part for part, kind in PARTS.items() for field in dataclasses.fields(kind)}


def make_config(**settings) -> TrainConfig:
    """The TrainConfig of settings given by their flags' names (the others take their defaults).

    Raises:
      TypeError: a name that is no setting (a caller's bug).
      SettingsError: a value that cannot work, naming its flag.
    """
    owners = setting_names()
    values = {part: {} for part in PARTS}
    for name, value in settings.items():
        if name not in owners:
            raise TypeError(f"no setting is named {name!r}")
        values[owners[name]][name] = value
    return TrainConfig(**{part: kind(**values[part]) for part, kind in PARTS.items()})
