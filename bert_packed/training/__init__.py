"""Training: losses and metrics (per-sequence), optimizer, schedule, trainer loop."""

from bert_packed.training.losses import LOSS_AVERAGING, loss_from_sums, metrics_from_sums, pretraining_sums

__all__ = ["LOSS_AVERAGING", "loss_from_sums", "metrics_from_sums", "pretraining_sums"]
