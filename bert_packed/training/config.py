"""A training run's configuration, in the parts a reader thinks in: model, data, optimizer, run.

Plain frozen dataclasses; bert_packed.cli.run_pretraining builds them from flags. Step counts
are the MLPerf reference's: micro-steps. One update is `steps_per_update` micro-steps, each a
micro-batch of `batch_size` rows, so a run of num_train_steps makes
num_train_steps // steps_per_update updates (docs/training.md).
"""

from __future__ import annotations

import dataclasses

from bert_packed.features import Shapes
from bert_packed.model import BertConfig


@dataclasses.dataclass(frozen=True)
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


@dataclasses.dataclass(frozen=True)
class TrainData:
    """The training data and how much of it one update takes.

    Attributes:
      files: the TFRecord files.
      shapes: L, P and S of the records (S = 1 for unpacked files).
      input_mode: "packed", "padded" or "bucketed" (input_pipeline.MODES).
      packing_factor: sequences per row of the data (1.0 unpacked).
      num_sequences: sequences in the files (from metadata.json; 0 when unknown).
      batch_size: rows (packs when packed; --adjust_batch_for_packing has already divided) per
        micro-batch, all replicas together.
      steps_per_update: micro-batches accumulated into one update.
      bucket_boundaries: with "bucketed", the lengths batches are trimmed to.
    """

    files: tuple[str, ...]
    shapes: Shapes
    input_mode: str = "packed"
    packing_factor: float = 1.0
    num_sequences: int = 0
    batch_size: int = 8
    steps_per_update: int = 1
    bucket_boundaries: tuple[int, ...] = ()

    @property
    def sequences_per_update(self) -> float:
        """Sequences an update holds on average (MLPerf's global batch size: it counts sequences)."""
        return self.batch_size * self.steps_per_update * self.packing_factor


@dataclasses.dataclass(frozen=True)
class EvalData:
    """The evaluation data (packed or unpacked records give the same figures).

    Attributes:
      files: the TFRecord files (empty: no evaluation).
      shapes: L, P and S of the records.
      packed: whether the records are packs (from the data's metadata.json).
      batch_size: rows per eval batch.
      every_samples: evaluate every this many training sequences (0: once at the end).
      target_mlm_accuracy: stop when an evaluation reaches this masked-LM accuracy.
      max_steps: evaluate at most this many batches (None: the whole set).
    """

    files: tuple[str, ...] = ()
    shapes: Shapes | None = None
    packed: bool = False
    batch_size: int = 8
    every_samples: int = 0
    target_mlm_accuracy: float = 0.720
    max_steps: int | None = None


@dataclasses.dataclass(frozen=True)
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
      clip_after_allreduce: clip the gradient of the whole update (summed over micro-batches and
        replicas) to global norm 1; False (the reference's default): clip each replica's gradient
        of each micro-batch, then average them.
    """

    name: str = "lamb"
    learning_rate: float = 4.25e-4
    num_train_steps: int = 100
    num_warmup_steps: int = 0
    start_warmup_step: int = 0
    beta_1: float = 0.9
    beta_2: float = 0.999
    weight_decay_rate: float = 0.01
    epsilon: float = 1e-6
    adjust_betas_for_packing: bool = False
    poly_power: float = 1.0
    clip_after_allreduce: bool = False


@dataclasses.dataclass(frozen=True)
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


@dataclasses.dataclass(frozen=True)
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


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs."""

    model: ModelConfig
    train_data: TrainData
    optimizer: OptimizerConfig
    run: RunConfig
    eval_data: EvalData = EvalData()
