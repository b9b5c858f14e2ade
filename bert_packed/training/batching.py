"""What one update holds, from the settings and the data together: rows a micro-batch (with
batch correction, packs for train_batch_size unpacked rows), LAMB's betas raised to the packing
factor, the MLPerf evaluation cadence; and the run's description of them at its start.
"""

from __future__ import annotations

import dataclasses

from bert_packed.training.config import (
    TrainConfig,
    finite,
    require,
    require_divides,
    require_packed_for,
    require_window,
)


def mlperf_eval_every_samples(sequences_per_update: float) -> int:
    """floor(0.05 * (230.23 * global batch + 3,000,000) / 25,000) * 25,000 (docs/training.md).

    >>> mlperf_eval_every_samples(448)
    150000
    """
    return int(0.05 * (230.23 * sequences_per_update + 3_000_000) // 25_000) * 25_000


def adjusted_betas(beta_1: float, beta_2: float, packing_factor: float) -> tuple[float, float]:
    """LAMB's betas for packed data: each raised to the packing factor, which keeps the momentum
    horizon of packing-factor unpacked updates (docs/training.md).

    >>> [round(b, 4) for b in adjusted_betas(0.9, 0.999, 2.0)]
    [0.81, 0.998]
    """
    require(finite(packing_factor) and packing_factor >= 1.0, f"a packing factor is at least 1, got {packing_factor}")
    return beta_1 ** packing_factor, beta_2 ** packing_factor


@dataclasses.dataclass(frozen=True)
class Batching:
    """What one update holds, from the settings and the data together.

    Attributes:
      rows_per_micro_batch: rows of one micro-batch, all replicas: train_batch_size, or with batch
        correction the packs that hold on average as many sequences as train_batch_size unpacked
        rows, a multiple of the replicas (which share it evenly). For example, 8 unpacked rows at
        packing factor 1.203 become 7 packs (8.42 sequences on average); 448 rows at packing
        factor 2.012 on 8 replicas become 224 packs.
      steps_per_update: micro-batches an update accumulates.
      packing_factor: sequences per row of the data.
      betas: LAMB's betas as used (raised to the packing factor with adjust_betas_for_packing).
    """

    rows_per_micro_batch: int
    steps_per_update: int
    packing_factor: float
    betas: tuple[float, float]

    @property
    def sequences_per_update(self) -> float:
        """Sequences an update holds on average (MLPerf's global batch size: it counts sequences)."""
        return self.rows_per_micro_batch * self.steps_per_update * self.packing_factor


def batching(config: TrainConfig, input_mode: str, packing_factor: float, max_sequences_per_pack: int,
             num_replicas: int = 1) -> Batching:
    """What one update of `config` holds on data read in `input_mode` at `packing_factor`, on
    `num_replicas` replicas; the checks that need the data and the replicas.

    Raises:
      SettingsError: naming the flag.
    """
    data, optimizer = config.batch, config.optimizer
    require_packed_for(input_mode, adjust_betas_for_packing=optimizer.adjust_betas_for_packing,
                       adjust_batch_for_packing=data.adjust_batch_for_packing)
    require(not data.bucket_boundaries or input_mode == "bucketed", "--bucket_boundaries is for --input_mode=bucketed")
    require(finite(packing_factor) and 1.0 <= packing_factor <= max_sequences_per_pack,
            f"a packing factor of {packing_factor} with at most {max_sequences_per_pack} sequences a row: it lies in "
            f"[1, {max_sequences_per_pack}]")
    if input_mode == "packed_online":
        require_window(data.online_packing_window, max_sequences_per_pack)
    rows = data.train_batch_size
    if data.adjust_batch_for_packing:
        rows = max(1, round(rows / packing_factor / num_replicas)) * num_replicas
    require_divides("--train_batch_size", rows, num_replicas)
    betas = (optimizer.lamb_beta_1, optimizer.lamb_beta_2)
    if optimizer.adjust_betas_for_packing:
        betas = adjusted_betas(*betas, packing_factor)
    return Batching(rows, data.steps_per_update, packing_factor, betas)


def eval_every_samples(config: TrainConfig, batch: Batching) -> int:
    """Sequences between evaluations (0: only at the end), the MLPerf cadence resolved."""
    every = config.eval.eval_every_samples
    return mlperf_eval_every_samples(batch.sequences_per_update) if every < 0 else every


def describe_run(config: TrainConfig, batch: Batching) -> list[str]:
    """What the run does, in a line or two for its start."""
    data, o, (beta_1, beta_2) = config.batch, config.optimizer, batch.betas
    lines = []
    if data.adjust_batch_for_packing:
        lines.append(f"--adjust_batch_for_packing: {batch.rows_per_micro_batch} packs a micro-batch instead of "
                     f"{data.train_batch_size} rows at packing factor {batch.packing_factor:.3f}: "
                     f"{batch.sequences_per_update:.1f} sequences an update on average (unpacked: "
                     f"{data.train_batch_size * data.steps_per_update})")
    lines.append(f"optimizer {o.optimizer}, betas {beta_1:.6g} / {beta_2:.6g} (packing factor {batch.packing_factor:.3f}, "
                 f"adjusted: {o.adjust_betas_for_packing}); {config.last_step} micro-steps of "
                 f"{batch.rows_per_micro_batch} rows, {data.steps_per_update} an update "
                 f"({batch.sequences_per_update:.1f} sequences on average), {config.loop_steps} a compiled loop; "
                 f"checkpoints every {config.save_steps}")
    return lines
