"""Pre-training losses and metrics, unpacked per sequence.

Everything is returned as additive sums and counts (float32 scalars): the trainer adds them over
micro-batches and replicas and divides once, so accumulated or distributed results equal one
big batch. A sequence never spans two rows, so per-sequence quantities are additive too.

Two averaging bases for the masked-LM loss (docs/model.md), both identical for a set of
sequences whether they arrive packed or one per row:
  token     sum of the NLL of every prediction / number of predictions (the MLPerf reference);
  sequence  mean NLL inside each sequence, summed / number of sequences with predictions.
The NSP loss averages over sequences (one prediction each, weighted by next_sentence_weights).
The total loss is MLM + NSP, as in the reference; a model without the next-sentence head
(--nsp_loss=false) trains on the MLM loss alone.
"""

from __future__ import annotations

import tensorflow as tf

from bert_packed.errors import SettingsError
from bert_packed.training.config import LOSS_AVERAGING


def pretraining_sums(outputs: dict, features: dict) -> dict[str, tf.Tensor]:
    """Sums and counts behind every loss and metric of a batch.

    Args:
      outputs: the model's {"mlm_logits": [B, P', V], "nsp_logits": [B, S, 2]} (without
        "nsp_logits", masked-LM only: nsp_nll and nsp_correct are 0).
      features: the packed feature dict (masked_lm_ids, prediction_sequence_ids = sequence index
        of each prediction or 0, next_sentence_labels, next_sentence_weights).

    Returns:
      float32 scalars: mlm_nll (sum over predictions), mlm_predictions, mlm_correct,
      mlm_sequence_nll (sum over sequences of their mean NLL), mlm_sequence_correct (sum of
      per-sequence accuracies), mlm_sequences, nsp_nll, nsp_correct, nsp_sequences.
    """
    nll, correct, valid = _predictions(outputs, features)
    per_sequence_nll = _by_sequence(nll, features)
    per_sequence_correct = _by_sequence(correct, features)
    per_sequence_count = _by_sequence(valid, features)
    denominator = tf.maximum(per_sequence_count, 1.0)
    nsp_weights = tf.cast(features["next_sentence_weights"], tf.float32)
    nsp_nll, nsp_correct = _next_sentence(outputs, features)
    return {
        "mlm_nll": tf.reduce_sum(nll),
        "mlm_predictions": tf.reduce_sum(valid),
        "mlm_correct": tf.reduce_sum(correct),
        "mlm_sequence_nll": tf.reduce_sum(per_sequence_nll / denominator),
        "mlm_sequence_correct": tf.reduce_sum(per_sequence_correct / denominator),
        "mlm_sequences": tf.reduce_sum(tf.cast(per_sequence_count > 0, tf.float32)),
        "nsp_nll": tf.reduce_sum(nsp_nll),
        "nsp_correct": tf.reduce_sum(nsp_correct * nsp_weights),
        "nsp_sequences": tf.reduce_sum(nsp_weights),
    }


def pretraining_slot_losses(outputs: dict, features: dict) -> tf.Tensor:
    """Each slot's loss: its sequence's masked-LM NLL summed over its predictions, plus its
    next-sentence NLL; 0 for an empty slot. float32 [B, S], the same for a sequence wherever it
    sits (packed or one a row)."""
    nll, _, _ = _predictions(outputs, features)
    batch, depth = tf.shape(nll)[0], tf.shape(features["next_sentence_weights"])[1]
    nsp_nll, _ = _next_sentence(outputs, features)
    return tf.reshape(_by_sequence(nll, features), [batch, depth]) + nsp_nll                  # [B, S]


def _predictions(outputs: dict, features: dict) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Each prediction's NLL, whether it is right, and whether it is one ([B, P'] float32, 0 for
    an empty prediction slot)."""
    mlm_logits = tf.cast(outputs["mlm_logits"], tf.float32)
    labels = tf.cast(features["masked_lm_ids"], tf.int32)
    sequence_index = tf.cast(features["prediction_sequence_ids"], tf.int32)          # [B, P']
    valid = tf.cast(sequence_index > 0, tf.float32)
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=mlm_logits) * valid
    correct = tf.cast(tf.equal(tf.argmax(mlm_logits, -1, output_type=tf.int32), labels), tf.float32) * valid
    return nll, correct, valid


def _by_sequence(values: tf.Tensor, features: dict) -> tf.Tensor:
    """[B, P'] values of the predictions added up by their sequence: [B * S], row b's sequence k
    at b * S + (k - 1)."""
    sequence_index = tf.cast(features["prediction_sequence_ids"], tf.int32)
    batch = tf.shape(sequence_index)[0]
    depth = tf.shape(features["next_sentence_weights"])[1]
    num_cells = batch * depth
    rows = tf.range(batch)[:, None] * depth
    segment = tf.where(sequence_index > 0, rows + sequence_index - 1, num_cells)  # padding to a spare cell
    return tf.math.unsorted_segment_sum(values, segment, num_cells + 1)[:num_cells]


def _next_sentence(outputs: dict, features: dict) -> tuple[tf.Tensor, tf.Tensor]:
    """Each slot's next-sentence NLL (0 for an empty slot) and whether it is right ([B, S]); both
    0 without the next-sentence head."""
    nsp_weights = tf.cast(features["next_sentence_weights"], tf.float32)
    if "nsp_logits" not in outputs:  # masked-LM only: the sequences are still counted
        return tf.zeros_like(nsp_weights), tf.zeros_like(nsp_weights)
    nsp_logits = tf.cast(outputs["nsp_logits"], tf.float32)
    nsp_labels = tf.cast(features["next_sentence_labels"], tf.int32)
    nsp_nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits) * nsp_weights
    nsp_correct = tf.cast(tf.equal(tf.argmax(nsp_logits, -1, output_type=tf.int32), nsp_labels), tf.float32)
    return nsp_nll, nsp_correct


def normalizers(features: dict) -> dict[str, tf.Tensor]:
    """The counts of pretraining_sums, from the features alone (no forward pass needed).

    The trainer sums them over every micro-batch and replica of an update first, then divides
    each micro-batch's sums by these global counts: the gradients then add up to exactly the
    gradient of one big batch.
    """
    sequence_index = tf.cast(features["prediction_sequence_ids"], tf.int32)
    depth = tf.shape(features["next_sentence_weights"])[1]
    has_predictions = tf.reduce_any(sequence_index[:, None, :] == tf.range(1, depth + 1)[None, :, None], axis=-1)
    return {
        "mlm_predictions": tf.reduce_sum(tf.cast(sequence_index > 0, tf.float32)),
        "mlm_sequences": tf.reduce_sum(tf.cast(has_predictions, tf.float32)),
        "nsp_sequences": tf.reduce_sum(tf.cast(features["next_sentence_weights"], tf.float32)),
    }


def loss_from_sums(sums: dict, loss_averaging: str = "token", counts: dict | None = None) -> tf.Tensor:
    """The total loss (MLM + NSP) of summed sums; 0 where a count is 0 (never NaN).

    Args:
      sums: pretraining_sums, possibly added over batches.
      loss_averaging: "token" or "sequence".
      counts: divide by these (normalizers summed over a whole update) instead of sums' own.
    """
    if loss_averaging not in LOSS_AVERAGING:
        raise SettingsError(f"unknown loss_averaging {loss_averaging!r}; expected one of {LOSS_AVERAGING}")
    counts = counts or sums
    if loss_averaging == "token":
        mlm = sums["mlm_nll"] / tf.maximum(counts["mlm_predictions"], 1.0)
    else:
        mlm = sums["mlm_sequence_nll"] / tf.maximum(counts["mlm_sequences"], 1.0)
    return mlm + sums["nsp_nll"] / tf.maximum(counts["nsp_sequences"], 1.0)


def metrics_from_sums(sums: dict, loss_averaging: str = "token", nsp_loss: bool = True) -> dict[str, float]:
    """Losses and accuracies as Python floats (logging and evaluation); without nsp_loss, no
    nsp_loss and nsp_accuracy (there is no next-sentence head to measure)."""
    values = {name: float(value) for name, value in sums.items()}

    def ratio(numerator, denominator):
        return values[numerator] / values[denominator] if values[denominator] else 0.0

    metrics = {
        "loss": float(loss_from_sums(sums, loss_averaging)),
        "mlm_loss": ratio("mlm_nll", "mlm_predictions") if loss_averaging == "token"
        else ratio("mlm_sequence_nll", "mlm_sequences"),
        "nsp_loss": ratio("nsp_nll", "nsp_sequences"),
        "mlm_accuracy": ratio("mlm_correct", "mlm_predictions"),           # the MLPerf metric
        "mlm_sequence_accuracy": ratio("mlm_sequence_correct", "mlm_sequences"),
        "nsp_accuracy": ratio("nsp_correct", "nsp_sequences"),
        "num_sequences": values["nsp_sequences"],  # in these sums (not the samples seen so far)
    }
    if not nsp_loss:
        del metrics["nsp_loss"], metrics["nsp_accuracy"]
    return metrics


def classifier_sums(outputs: dict, features: dict, regression: bool) -> dict[str, tf.Tensor]:
    """Sums behind a fine-tuning loss, per example whatever the rows hold (packed or one a row).

    Args:
      outputs: BertClassifierModel's {"logits": [B, S, C]}.
      features: the fine-tuning rows' labels and label_weights [B, S].
      regression: the one output is a score (squared error), not a class's logit (cross-entropy).

    Returns:
      float32 scalars: example_loss (the examples' losses summed), examples (how many), and
      example_correct (right classes; 0 for a regression).
    """
    weights = tf.cast(features["label_weights"], tf.float32)                              # [B, S]
    loss, correct = _classifier_losses(outputs, features, regression)
    return {"example_loss": tf.reduce_sum(loss * weights), "examples": tf.reduce_sum(weights),
            "example_correct": tf.reduce_sum(correct * weights)}


def classifier_slot_losses(outputs: dict, features: dict, regression: bool) -> tf.Tensor:
    """Each slot's example loss (classifier_sums'), 0 for an empty slot: float32 [B, S]."""
    loss, _ = _classifier_losses(outputs, features, regression)
    return loss * tf.cast(features["label_weights"], tf.float32)


def _classifier_losses(outputs: dict, features: dict, regression: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Each slot's loss and whether its class is right ([B, S]; a regression is never right)."""
    logits = tf.cast(outputs["logits"], tf.float32)
    if regression:
        return tf.square(logits[..., 0] - features["labels"]), tf.zeros_like(features["labels"], tf.float32)
    labels = tf.cast(features["labels"], tf.int32)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return loss, tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)


def span_sums(outputs: dict, features: dict) -> dict[str, tf.Tensor]:
    """Sums behind a span task's loss (SQuAD), per example whatever the rows hold: each
    sequence's cross-entropy of its answer's first token and of its last, halved (google-research's
    run_squad: (start loss + end loss) / 2).

    Args:
      outputs: BertQuestionAnsweringModel's {"start_logits", "end_logits": [B, S, L]}, each
        sequence's own (position 0 at its [CLS]).
      features: the rows' start_positions, end_positions and label_weights [B, S].

    Returns:
      float32 scalars: example_loss (summed over the sequences), examples (how many) and
      example_correct (sequences whose most likely start and end are both the answer's).
    """
    weights = tf.cast(features["label_weights"], tf.float32)                              # [B, S]
    loss, correct = _span_losses(outputs, features)
    return {"example_loss": tf.reduce_sum(loss * weights), "examples": tf.reduce_sum(weights),
            "example_correct": tf.reduce_sum(correct * weights)}


def span_slot_losses(outputs: dict, features: dict) -> tf.Tensor:
    """Each slot's span loss (span_sums'), 0 for an empty slot: float32 [B, S]."""
    loss, _ = _span_losses(outputs, features)
    return loss * tf.cast(features["label_weights"], tf.float32)


def _span_losses(outputs: dict, features: dict) -> tuple[tf.Tensor, tf.Tensor]:
    """Each slot's halved start and end cross-entropy, and whether both are right ([B, S])."""
    loss, correct = 0.0, 1.0
    for name in ("start", "end"):
        logits, positions = outputs[f"{name}_logits"], features[f"{name}_positions"]
        loss += tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positions, logits=logits) / 2
        correct *= tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), positions), tf.float32)
    return loss, correct
