"""A training run's configuration, in the parts a reader thinks in: model, data, optimizer, run.

Each part checks its own values when it is built, wherever that happens (the command line, a
benchmark, a test): a value that cannot work is a SettingsError naming the flag that sets it. The
defaults are written once, here; the command line takes its flags' defaults from these classes.
Values derived from several settings (the corrected batch, the cadences of compiled loops,
checkpoints and evaluations, the betas) are properties of the part that holds those settings.

Step counts are the MLPerf reference's: micro-steps. One update is `steps_per_update`
micro-steps, each a micro-batch of `rows_per_micro_batch` rows (all replicas together), so a run
of num_train_steps makes num_train_steps // steps_per_update updates (docs/training.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.model.config import BertConfig

# How training data is read (bert_packed.input_pipeline): packs from packed records, unpacked
# records one a row (padded), grouped by length (bucketed), packed as they are read, or packed
# records' sequences one a row (packs_as_rows: the update composition of packs, without packing).
INPUT_MODES = ("packed", "padded", "bucketed", "packed_online", "packs_as_rows")
# The modes whose micro-batch counts packs (--train_batch_size, the packing factor, the betas).
PACK_MODES = ("packed", "packed_online", "packs_as_rows")
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
# The longest sequence any BERT takes (the planner's limit too).
MAX_SEQ_LENGTH_LIMIT = 65_536


def require(condition: bool, message: str) -> None:
    """Raises SettingsError(message) unless `condition` holds."""
    if not condition:
        raise SettingsError(message)


def require_packed_for(input_mode: str, **settings: bool) -> None:
    """Raises SettingsError when a setting that only packed data has (given by its flag's name)
    is on and the input is not read as packs."""
    for name, on in settings.items():
        require(not on or input_mode in PACK_MODES,
                f"--{name} needs packed data, not --input_mode={input_mode}")


def require_fits(max_seq_length: int, bert: BertConfig) -> None:
    """Raises SettingsError when sequences of max_seq_length do not fit the model's positions."""
    require(max_seq_length <= bert.max_position_embeddings, f"--max_seq_length={max_seq_length} exceeds "
                                                            f"max_position_embeddings={bert.max_position_embeddings} "
                                                            f"of the BERT config")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value (and >= multiple).

    >>> round_up(5, 2), round_up(4, 2), round_up(1, 3)
    (6, 4, 3)
    """
    return max(multiple, -(-value // multiple) * multiple)


def mlperf_eval_every_samples(sequences_per_update: float) -> int:
    """floor(0.05 * (230.23 * global batch + 3,000,000) / 25,000) * 25,000 (docs/training.md).

    >>> mlperf_eval_every_samples(448)
    150000
    """
    return int(0.05 * (230.23 * sequences_per_update + 3_000_000) // 25_000) * 25_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model and how it computes.

    Attributes:
      bert: the BERT hyper-parameters.
      init_checkpoint: a google-research/MLPerf TF1 checkpoint to start from (None: random).
      loss_averaging: the MLM loss basis, "token" (MLPerf) or "sequence" (docs/model.md).
      precision: "fp32", "bf16" or "fp16" (fp16 with dynamic loss scaling).
      xla: compile the forward and backward pass with XLA.
    """

    bert: BertConfig
    init_checkpoint: str | None = None
    loss_averaging: str = "token"
    precision: str = "fp32"
    xla: bool = False

    def __post_init__(self):
        require(self.loss_averaging in LOSS_AVERAGING,
                f"--loss_averaging={self.loss_averaging}: expected one of {', '.join(LOSS_AVERAGING)}")
        require(self.precision in PRECISIONS, f"--precision={self.precision}: expected one of {', '.join(PRECISIONS)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainData:
    """The training data and how much of it one update takes.

    Attributes:
      files: the TFRecord files.
      shapes: L, P and S of what the model is fed (S = 1 unless packed).
      input_mode: one of INPUT_MODES.
      packing_factor: sequences per row of the data (1.0 unpacked; packed on the fly, what the
        plan predicts).
      num_sequences: sequences in the files (0 when unknown).
      batch_size: rows per micro-batch, all replicas (--train_batch_size): packs when packed,
        unpacked rows with adjust_batch_for_packing.
      adjust_batch_for_packing: batch correction: a micro-batch takes as many packs as hold
        batch_size unpacked rows' sequences on average (rows_per_micro_batch).
      steps_per_update: micro-batches accumulated into one update.
      bucket_boundaries: with "bucketed", the lengths batches are trimmed to.
      num_replicas: replicas that share a micro-batch (the strategy's).
      plan: with "packed_online", the plan's strategies ((lengths, count), ...) the packer fills.
      histogram: with "packed_online", the files' length histogram the plan was made on.
      online_packing_window: with "packed_online", sequences the packer may hold at once.
      identity: (path, bytes, hash of the first 64 KiB) of each file (training.data): a resumed
        run refuses data made again since it started.
    """

    files: tuple[str, ...]
    shapes: Shapes
    input_mode: str = "packed"
    packing_factor: float = 1.0
    num_sequences: int = 0
    batch_size: int = 8
    adjust_batch_for_packing: bool = False
    steps_per_update: int = 1
    bucket_boundaries: tuple[int, ...] = ()
    num_replicas: int = 1
    plan: tuple = ()
    histogram: tuple = ()
    online_packing_window: int = ONLINE_PACKING_WINDOW
    identity: tuple = ()

    def __post_init__(self):
        require(bool(self.files), "--input_file: no training files")
        require(self.input_mode in INPUT_MODES,
                f"--input_mode={self.input_mode}: expected one of {', '.join(INPUT_MODES)}")
        require(self.batch_size >= 1, f"--train_batch_size={self.batch_size}: must be >= 1")
        require(self.steps_per_update >= 1, f"--steps_per_update={self.steps_per_update}: must be >= 1")
        require(self.num_replicas >= 1, f"{self.num_replicas} replicas: must be >= 1")
        require(self.num_sequences >= 0, f"{self.num_sequences} training sequences: must be >= 0")
        depth = self.shapes.max_sequences_per_pack
        require(_finite(self.packing_factor) and 1.0 <= self.packing_factor <= depth,
                f"a packing factor of {self.packing_factor} with at most {depth} sequences a row: it lies in "
                f"[1, {depth}]")
        require_packed_for(self.input_mode, adjust_batch_for_packing=self.adjust_batch_for_packing)
        require(self.input_mode != "packed_online" or bool(self.plan), "--input_mode=packed_online needs a plan")
        require_window(self.online_packing_window, self.shapes.max_sequences_per_pack)
        require(not self.bucket_boundaries or self.input_mode == "bucketed",
                "--bucket_boundaries is for --input_mode=bucketed")
        require(all(1 <= b <= self.shapes.max_seq_length for b in self.bucket_boundaries),
                f"--bucket_boundaries={','.join(map(str, self.bucket_boundaries))}: each in "
                f"[1, {self.shapes.max_seq_length}]")
        require(self.rows_per_micro_batch % self.num_replicas == 0,
                f"--train_batch_size={self.batch_size} rows do not divide among the {self.num_replicas} replicas: use "
                f"a multiple of {self.num_replicas}")

    @property
    def packed(self) -> bool:
        """Whether a row holds several sequences."""
        return self.input_mode in PACK_MODES

    @functools.cached_property
    def rows_per_micro_batch(self) -> int:
        """Rows of one micro-batch, all replicas together: batch_size, or with batch correction the
        packs that hold on average as many sequences as batch_size unpacked rows, a multiple of the
        replicas (which share it evenly).

        For example, 8 unpacked rows at packing factor 1.203 become 7 packs (8.42 sequences on
        average); 448 rows at packing factor 2.012 on 8 replicas become 224 packs.
        """
        if not self.adjust_batch_for_packing:
            return self.batch_size
        replicas = self.num_replicas
        return max(1, round(self.batch_size / self.packing_factor / replicas)) * replicas

    @property
    def sequences_per_update(self) -> float:
        """Sequences an update holds on average (MLPerf's global batch size: it counts sequences)."""
        return self.rows_per_micro_batch * self.steps_per_update * self.packing_factor


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalData:
    """The evaluation data (packed or unpacked records give the same figures).

    Attributes:
      files: the TFRecord files (empty: no evaluation).
      shapes: L, P and S of what the model is fed.
      input_mode: "padded" (unpacked records), "packed" (packed records) or "packed_online"
        (unpacked records packed as they are read).
      plan, online_packing_window: with "packed_online", as for TrainData.
      batch_size: rows per eval batch, all replicas.
      every_samples: evaluate every this many training sequences; -1: the MLPerf cadence; 0:
        only at the end.
      target_mlm_accuracy: stop when an evaluation reaches this masked-LM accuracy.
      max_steps: evaluate at most this many batches (None: the whole set).
      identity: (path, bytes, hash of the first 64 KiB) of each file, as for TrainData.
    """

    files: tuple[str, ...] = ()
    shapes: Shapes | None = None
    input_mode: str = "padded"
    batch_size: int = 8
    every_samples: int = -1
    target_mlm_accuracy: float = 0.720
    max_steps: int | None = None
    plan: tuple = ()
    online_packing_window: int = ONLINE_PACKING_WINDOW
    identity: tuple = ()

    def __post_init__(self):
        require(not self.files or self.shapes is not None, "eval files need their shapes")
        require(self.input_mode in ("padded", "packed", "packed_online"),
                f"--eval_input_mode={self.input_mode}: expected padded, packed or packed_online")
        require(self.input_mode != "packed_online" or bool(self.plan), "--eval_input_mode=packed_online needs a plan")
        if self.input_mode == "packed_online":
            require_window(self.online_packing_window, self.shapes.max_sequences_per_pack)
        require(self.batch_size >= 1, f"--eval_batch_size={self.batch_size}: must be >= 1")
        require(self.every_samples >= -1, f"--eval_every_samples={self.every_samples}: must be >= -1 (-1: the MLPerf "
                                          f"cadence, 0: only at the end)")
        require(_finite(self.target_mlm_accuracy) and 0.0 <= self.target_mlm_accuracy <= 1.0,
                f"--target_mlm_accuracy={self.target_mlm_accuracy}: must be in [0, 1]")
        require(self.max_steps is None or self.max_steps >= 1, f"--max_eval_steps={self.max_steps}: must be >= 1")


def require_window(window: int, depth: int) -> None:
    require(depth <= window <= MAX_ONLINE_PACKING_WINDOW,
            f"--online_packing_window={window}: at least --max_sequences_per_pack={depth} and at most "
            f"{MAX_ONLINE_PACKING_WINDOW:,} sequences (each held sequence costs memory; {ONLINE_PACKING_WINDOW:,} "
            f"packs within 0.001 points of the offline plan)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer and its learning-rate schedule (docs/training.md).

    Attributes:
      name: "lamb" (MLPerf) or "adamw" (original BERT).
      learning_rate: the peak learning rate.
      num_train_steps: micro-steps in the run (the schedule decays to 0 there).
      num_warmup_steps: linear warmup micro-steps.
      start_warmup_step: the warmup's origin (negative: start partway through it).
      poly_power: the power of the polynomial decay.
      beta_1, beta_2: the moment decays before any packing adjustment.
      weight_decay_rate: decoupled weight decay inside the update.
      epsilon: added to the second moment's root.
      adjust_betas_for_packing: raise both betas to the power of the data's packing factor.
      clip_norm: the global gradient norm clipped to.
      clip_after_allreduce: clip the gradient of the whole update (summed over micro-batches and
        replicas); False (the reference's default): clip each replica's gradient of each
        micro-batch, then average them.
    """

    name: str = "lamb"
    learning_rate: float = 4.25e-4
    num_train_steps: int = 100
    num_warmup_steps: int = 0
    start_warmup_step: int = 0
    poly_power: float = 1.0
    beta_1: float = 0.9
    beta_2: float = 0.999
    weight_decay_rate: float = 0.01
    epsilon: float = 1e-6
    adjust_betas_for_packing: bool = False
    clip_norm: float = 1.0
    clip_after_allreduce: bool = False

    def __post_init__(self):
        require(self.name in OPTIMIZERS, f"--optimizer={self.name}: expected one of {', '.join(OPTIMIZERS)}")
        require(_finite(self.learning_rate) and self.learning_rate >= 0,
                f"--learning_rate={self.learning_rate}: must be a number >= 0")
        require(self.num_train_steps >= 1, f"--num_train_steps={self.num_train_steps}: must be >= 1")
        require(self.num_warmup_steps >= 0, f"--num_warmup_steps={self.num_warmup_steps}: must be >= 0")
        require(self.num_warmup_steps <= self.num_train_steps,
                f"--num_warmup_steps={self.num_warmup_steps} exceeds --num_train_steps={self.num_train_steps}")
        require(_finite(self.poly_power) and self.poly_power >= 0, f"--poly_power={self.poly_power}: must be >= 0")
        for name in ("beta_1", "beta_2"):
            value = getattr(self, name)
            require(_finite(value) and 0.0 <= value < 1.0, f"--lamb_{name}={value}: must be in [0, 1)")
        require(_finite(self.weight_decay_rate) and self.weight_decay_rate >= 0,
                f"--lamb_weight_decay_rate={self.weight_decay_rate}: must be >= 0")
        require(_finite(self.epsilon) and self.epsilon > 0, f"--epsilon={self.epsilon}: must be > 0")
        require(_finite(self.clip_norm) and self.clip_norm > 0, f"a clip norm of {self.clip_norm}: must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Submission:
    """The MLPerf submission fields logged in mllog.txt.

    Attributes:
      org: the submitting organisation.
      platform: the system the run is on.
      division: "closed" or "open".
      status: "onprem", "cloud", "preview" or "research".
    """

    org: str = "unsubmitted"
    platform: str = "unsubmitted"
    division: str = "closed"
    status: str = "onprem"

    def __post_init__(self):
        require(self.division in DIVISIONS, f"--submission_division={self.division}: expected closed or open")
        require(self.status in STATUSES, f"--submission_status={self.status}: expected one of {', '.join(STATUSES)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where the run writes, how it seeds and how often it saves and reports.

    Attributes:
      output_dir: logs, checkpoints and TensorBoard; a run restarted here resumes.
      seed: seeds initialisation, data order and dropout.
      deterministic: the same configuration gives the same results (op determinism).
      save_checkpoints_steps: checkpoint every this many micro-steps (and at the end).
      keep_checkpoint_max: checkpoints kept (older ones are deleted).
      iterations_per_loop: micro-steps run in one compiled call, without host reads; logs,
        checkpoints and evaluations happen between calls.
      log_every_steps: a progress line every this many micro-steps.
      flags_text: the command line that started the run, recorded in flags.txt once the
        output directory is claimed.
      submission: the MLPerf submission fields of mllog.txt.
    """

    output_dir: str
    seed: int = 12345
    deterministic: bool = False
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    iterations_per_loop: int = 1
    log_every_steps: int = 10
    flags_text: str = ""
    submission: Submission = Submission()

    def __post_init__(self):
        require(bool(self.output_dir), "--output_dir is required")
        require(0 <= self.seed < 2**63, f"--seed={self.seed}: must be >= 0")
        for flag in ("save_checkpoints_steps", "keep_checkpoint_max", "iterations_per_loop", "log_every_steps"):
            require(getattr(self, flag) >= 1, f"--{flag}={getattr(self, flag)}: must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run needs, checked together (what no single part can check alone)."""

    model: ModelConfig
    train_data: TrainData
    optimizer: OptimizerConfig
    run: RunConfig
    eval_data: EvalData = EvalData()

    def __post_init__(self):
        n, optimizer, bert = self.train_data.steps_per_update, self.optimizer, self.model.bert
        require(optimizer.num_train_steps >= n, f"--num_train_steps={optimizer.num_train_steps} is less than one "
                                                f"update of --steps_per_update={n} micro-steps")
        require_packed_for(self.train_data.input_mode, adjust_betas_for_packing=optimizer.adjust_betas_for_packing)
        for shapes in (self.train_data.shapes, self.eval_data.shapes):
            if shapes is not None:
                require_fits(shapes.max_seq_length, bert)

    def on_replicas(self, num_replicas: int) -> TrainConfig:
        """This configuration for a strategy of `num_replicas` replicas (the batch correction
        rounds to them; a micro-batch must divide among them)."""
        if num_replicas == self.train_data.num_replicas:
            return self
        return dataclasses.replace(self, train_data=dataclasses.replace(self.train_data, num_replicas=num_replicas))

    @functools.cached_property
    def last_step(self) -> int:
        """The micro-step the run ends at: whole updates only."""
        n = self.train_data.steps_per_update
        return self.optimizer.num_train_steps // n * n

    @functools.cached_property
    def loop_steps(self) -> int:
        """Micro-steps in one compiled call: iterations_per_loop rounded up to whole updates."""
        return round_up(self.run.iterations_per_loop, self.train_data.steps_per_update)

    @functools.cached_property
    def save_steps(self) -> int:
        """Micro-steps between checkpoints: save_checkpoints_steps rounded up to whole loops."""
        return round_up(self.run.save_checkpoints_steps, self.loop_steps)

    @functools.cached_property
    def eval_every_samples(self) -> int:
        """Sequences between evaluations (0: only at the end), the MLPerf cadence resolved."""
        every = self.eval_data.every_samples
        return mlperf_eval_every_samples(self.train_data.sequences_per_update) if every < 0 else every

    @functools.cached_property
    def betas(self) -> tuple[float, float]:
        """LAMB's betas as used: raised to the packing factor with adjust_betas_for_packing."""
        o = self.optimizer
        if not o.adjust_betas_for_packing:
            return o.beta_1, o.beta_2
        return o.beta_1 ** self.train_data.packing_factor, o.beta_2 ** self.train_data.packing_factor

    def describe(self) -> list[str]:
        """What the run does, in a line or two for its start."""
        data, o, (beta_1, beta_2) = self.train_data, self.optimizer, self.betas
        lines = []
        if data.adjust_batch_for_packing:
            lines.append(f"--adjust_batch_for_packing: {data.rows_per_micro_batch} packs a micro-batch instead of "
                         f"{data.batch_size} rows at packing factor {data.packing_factor:.3f}: "
                         f"{data.sequences_per_update:.1f} sequences an update on average (unpacked: "
                         f"{data.batch_size * data.steps_per_update})")
        lines.append(f"optimizer {o.name}, betas {beta_1:.6g} / {beta_2:.6g} (packing factor {data.packing_factor:.3f}, "
                     f"adjusted: {o.adjust_betas_for_packing}); {self.last_step} micro-steps of "
                     f"{data.rows_per_micro_batch} rows, {data.steps_per_update} an update "
                     f"({data.sequences_per_update:.1f} sequences on average), {self.loop_steps} a compiled loop; "
                     f"checkpoints every {self.save_steps}")
        return lines

    def rounding_notes(self) -> list[str]:
        """What the cadences round, in words: micro-step counts that do not fall on whole updates
        or compiled loops round up, as on the reference's TPU (checkpoints and evaluations only
        between loops)."""
        n, run, optimizer = self.train_data.steps_per_update, self.run, self.optimizer
        notes = []
        if optimizer.num_train_steps % n:
            notes.append(f"--num_train_steps={optimizer.num_train_steps} is not a multiple of --steps_per_update={n}: "
                         f"the last {optimizer.num_train_steps % n} micro-steps make no update and are not run")
        if self.loop_steps != run.iterations_per_loop:
            notes.append(f"--iterations_per_loop={run.iterations_per_loop} rounds up to {self.loop_steps}, whole "
                         f"updates of --steps_per_update={n}")
        if self.save_steps != run.save_checkpoints_steps:
            notes.append(f"--save_checkpoints_steps={run.save_checkpoints_steps} is not a multiple of the loop of "
                         f"{self.loop_steps} micro-steps: checkpoints every {self.save_steps}")
        if self.loop_steps > 1 and self.eval_data.files:
            notes.append(f"evaluations happen between compiled loops of {self.loop_steps} micro-steps: each at the "
                         f"first loop end after its cadence")
        return notes
