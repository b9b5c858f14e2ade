"""What a run trains the model to do: the model it builds, the sums of a batch, the counts they
are divided by, the loss and the metrics.

The compiled step (step.py, update.py) is the same for every objective: it calls these. Each
objective's sums are additive over micro-batches, replicas and the sequences of a row, so packed
rows and one sequence a row give the same loss, gradients and metrics.

  Pretraining(config)                   MLM + NSP on pre-training records (losses.pretraining_sums)
  Classification(config, outputs, ...)  a class (or a score) for each sequence of a fine-tuning
                                        row, from its own [CLS] (losses.classifier_sums)
"""

from __future__ import annotations

import tensorflow as tf

from bert_packed.model import BertClassifierModel, BertPretrainingModel
from bert_packed.training.config import TrainConfig
from bert_packed.training.losses import classifier_sums, loss_from_sums, metrics_from_sums, normalizers, pretraining_sums


class Pretraining:
    """BERT's pre-training objective, masked LM and (unless --nsp_loss=false) next sentence.

    Attributes:
      sum_keys: the names of `sums`' values, in the order an update reports them.
    """

    sum_keys = ("mlm_nll", "mlm_predictions", "mlm_correct", "mlm_sequence_nll", "mlm_sequence_correct",
                "mlm_sequences", "nsp_nll", "nsp_correct", "nsp_sequences")

    def __init__(self, config: TrainConfig):
        self.config = config

    def build_model(self) -> BertPretrainingModel:
        model = self.config.model
        return BertPretrainingModel(model.bert, model.nsp_loss, model.recompute)

    def sums(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        return pretraining_sums(outputs, features)

    def counts(self, features: dict) -> dict[str, tf.Tensor]:
        """What `loss` divides by, from the features alone (losses.normalizers)."""
        return normalizers(features)

    def loss(self, sums: dict, counts: dict | None = None) -> tf.Tensor:
        return loss_from_sums(sums, self.config.model.loss_averaging, counts)

    def metrics(self, sums: dict) -> dict[str, float]:
        return metrics_from_sums(sums, self.config.model.loss_averaging, self.config.model.nsp_loss)


class Classification:
    """Fine-tuning's objective: each example's class (cross-entropy) or score (squared error, a
    regression), averaged over the examples of an update, as google-research's run_classifier
    averages over a batch.

    Args:
      config: the run's settings (the model's BERT config and recompute).
      num_outputs: the classes, or 1 for a regression.
      regression: the one output is a score.
    """

    sum_keys = ("example_loss", "examples", "example_correct")

    def __init__(self, config: TrainConfig, num_outputs: int, regression: bool = False):
        self.config = config
        self.num_outputs = num_outputs
        self.regression = regression

    def build_model(self) -> BertClassifierModel:
        return BertClassifierModel(self.config.model.bert, self.num_outputs, self.config.model.recompute)

    def sums(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        return classifier_sums(outputs, features, self.regression)

    def counts(self, features: dict) -> dict[str, tf.Tensor]:
        return {"examples": tf.reduce_sum(tf.cast(features["label_weights"], tf.float32))}

    def loss(self, sums: dict, counts: dict | None = None) -> tf.Tensor:
        return sums["example_loss"] / tf.maximum((counts or sums)["examples"], 1.0)

    def metrics(self, sums: dict) -> dict[str, float]:
        examples = float(sums["examples"])
        metrics = {"loss": float(self.loss(sums)), "num_sequences": examples}
        if not self.regression:
            metrics["accuracy"] = float(sums["example_correct"]) / examples if examples else 0.0
        return metrics
