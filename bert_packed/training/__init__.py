"""Training: losses and metrics (per-sequence), optimizer, schedule, trainer loop."""

from bert_packed.training.losses import LOSS_AVERAGING, loss_from_sums, metrics_from_sums, pretraining_sums
from bert_packed.training.optimizers import AdamWeightDecay, Lamb, PolynomialWarmup, adjusted_betas

__all__ = ["LOSS_AVERAGING", "AdamWeightDecay", "Lamb", "PolynomialWarmup", "adjusted_betas", "loss_from_sums",
           "metrics_from_sums", "pretraining_sums"]
