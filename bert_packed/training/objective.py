"""What a run trains the model to do: the model it builds, the sums of a batch, the counts they
are divided by, the loss and the metrics.

The compiled step (step.py, update.py) is the same for every objective: it calls these. Each
objective's sums are additive over micro-batches, replicas and the sequences of a row, so packed
rows and one sequence a row give the same loss, gradients and metrics.

  Pretraining(config)                   MLM + NSP on pre-training records (losses.pretraining_sums)
  Classification(config, outputs, ...)  a class (or a score) for each sequence of a fine-tuning
                                        row, from its own [CLS] (losses.classifier_sums)
  SpanPrediction(config, answering)     an answer's span in each sequence (SQuAD), from its own
                                        tokens' start and end logits (losses.span_sums)
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import tensorflow as tf

from bert_packed.finetuning.metrics import scores as glue_scores
from bert_packed.finetuning.squad import SquadExample, Windows, predict_answers, squad_scores
from bert_packed.model import BertClassifierModel, BertEncoder, BertPretrainingModel, BertQuestionAnsweringModel, load_weights
from bert_packed.model.checkpoint import copy_weights
from bert_packed.model.huggingface import holds_classifier, holds_pooler, holds_span_head
from bert_packed.model.task_models import OUTSIDE_THE_SEQUENCE
from bert_packed.training.checkpoints import load_pretraining_checkpoint, pretraining_run_info
from bert_packed.training.config import TrainConfig
from bert_packed.training.losses import (
    classifier_slot_losses,
    classifier_sums,
    loss_from_sums,
    metrics_from_sums,
    normalizers,
    pretraining_slot_losses,
    pretraining_sums,
    span_slot_losses,
    span_sums,
)


class Pretraining:
    """BERT's pre-training objective, masked LM and (unless --nsp_loss=false) next sentence.

    Attributes:
      sum_keys: the names of `sums`' values, in the order an update reports them.
      mlperf: the run keeps the MLPerf log (mllog.txt).
      labels: the classes an export names (none).
      program: the command that runs it (a lock's holder says it).
      identity: what run.json records of the run beside its settings.
      sequences_key: the sum that counts the sequences trained on.
      graph_shape: what the compiled step's graph takes of it beyond the settings (step.graph_shape).
    """

    sequences_key = "nsp_sequences"
    unit = "sequences"  # what its logs count
    sum_keys = ("mlm_nll", "mlm_predictions", "mlm_correct", "mlm_sequence_nll", "mlm_sequence_correct",
                "mlm_sequences", "nsp_nll", "nsp_correct", "nsp_sequences")
    mlperf = True
    labels = ()
    program = "run_pretraining"
    identity: dict = {}  # the settings already say the run
    graph_shape = ()

    def __init__(self, config: TrainConfig):
        self.config = config

    def build_model(self) -> BertPretrainingModel:
        model = self.config.model
        return BertPretrainingModel(model.bert, model.nsp_loss, model.recompute)

    def load_initial_weights(self, model: BertPretrainingModel, path: str) -> str:
        """--init_checkpoint's weights (a TF1 checkpoint, a Hugging Face directory, or a pre-training
        run or one of its training checkpoints), all of them; returns the checkpoint read."""
        return _load_encoder(model, path)

    @staticmethod
    def reached(metrics: dict, config: TrainConfig) -> bool:
        """Whether an evaluation reached the run's target (--target_mlm_accuracy: a setting of the
        run, not of the compiled step, which another run may have built)."""
        return metrics.get("mlm_accuracy", 0.0) >= config.eval.target_mlm_accuracy

    @staticmethod
    def describe(metrics: dict) -> str:
        return (f"mlm accuracy {metrics.get('mlm_accuracy', 0.0):.4f}, loss {metrics.get('loss', 0.0):.4f} over "
                f"{metrics.get('num_sequences', 0):.0f} eval sequences")

    def sums(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        return pretraining_sums(outputs, features)

    @staticmethod
    def slot_losses(outputs: dict, features: dict) -> tf.Tensor:
        """Each sequence's loss in its slot: float32 [B, S] (losses.pretraining_slot_losses)."""
        return pretraining_slot_losses(outputs, features)

    def counts(self, features: dict) -> dict[str, tf.Tensor]:
        """What `loss` divides by, from the features alone (losses.normalizers)."""
        return normalizers(features)

    def loss(self, sums: dict, counts: dict | None = None) -> tf.Tensor:
        return loss_from_sums(sums, self.config.model.loss_averaging, counts)

    def example_outputs(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        """What an evaluation gathers example by example: nothing (every metric is a ratio of sums)."""
        return {}

    def metrics(self, sums: dict, examples: dict | None = None) -> dict[str, float]:
        return metrics_from_sums(sums, self.config.model.loss_averaging, self.config.model.nsp_loss)


class FineTuningObjective:
    """What fine-tuning's objectives share: a loss summed over the examples (the sequences of
    fine-tuning rows, a slot each) and divided by their number in the update, no MLPerf log, and
    no target (a run trains its epochs)."""

    sum_keys = ("example_loss", "examples", "example_correct")
    sequences_key = "examples"
    unit = "examples"
    mlperf = False
    graph_shape: tuple = ()

    @staticmethod
    def reached(metrics: dict, config: TrainConfig) -> bool:
        return False

    def counts(self, features: dict) -> dict[str, tf.Tensor]:
        return {"examples": tf.reduce_sum(tf.cast(features["label_weights"], tf.float32))}

    def loss(self, sums: dict, counts: dict | None = None) -> tf.Tensor:
        return sums["example_loss"] / tf.maximum((counts or sums)["examples"], 1.0)


class Classification(FineTuningObjective):
    """Fine-tuning's objective: each example's class (cross-entropy) or score (squared error, a
    regression), averaged over the examples of an update, as google-research's run_classifier
    averages over a batch.

    An evaluation also scores each example's prediction by the task's metrics (GLUE's: F1 and the
    correlations do not add up over batches).

    Args:
      config: the run's settings (the model's BERT config and recompute).
      labels: the classes, in the classifier's order; () for a regression (one output, a score).
      scores: the task's metrics (finetuning.tasks.Task.metrics).
      identity: what run.json records of the run beside its settings: the task, its labels, what
        makes its rows and its epochs (another value is another run).
    """

    program = "run_classifier"

    def __init__(self, config: TrainConfig, labels: tuple[str, ...], scores: tuple[str, ...] = (),
                 identity: dict | None = None):
        self.config = config
        self.identity = identity or {}
        self.labels = labels
        self.regression = not labels
        self.num_outputs = len(labels) or 1
        self.scores = scores
        self.graph_shape = (self.num_outputs, self.regression)

    def build_model(self) -> BertClassifierModel:
        return BertClassifierModel(self.config.model.bert, self.num_outputs, self.config.model.recompute)

    def load_initial_weights(self, model: BertClassifierModel, path: str) -> str:
        """--init_checkpoint's weights: a fine-tuned classifier's whole (a run's model.ckpt-N,
        google-research's, a BertForSequenceClassification directory); else pre-trained weights
        (in any format pre-training takes) for the encoder and pooler, the classifier starting
        from random weights, as google-research's does. Weights with no pooler (a masked-LM-only
        run's, a span model's) load into the rest, the pooler starting from random weights too,
        as transformers' BertForSequenceClassification starts from them; a warning says so. Returns
        the checkpoint read."""
        run = pretraining_run_info(path)
        if run is None and holds_classifier(path):
            load_weights(model, path)
            return path
        if run.get("nsp_loss", True) if run is not None else holds_pooler(path):
            return _load_encoder(model.encoder, path)
        without_pooler = BertEncoder(model.encoder.config, with_pooler=False)
        read = _load_encoder(without_pooler, path)
        copy_weights(without_pooler, model.encoder)
        logging.warning("%s: no pooler (weights trained with --nsp_loss=false, or a span model's): the classifier's "
                        "pooler starts from random weights, as its output layer does", path)
        return read

    def describe(self, metrics: dict) -> str:
        figures = [f"{name} {metrics[name]:.4f}" for name in ("accuracy", *self.scores) if name in metrics]
        return ", ".join(dict.fromkeys(figures)) + (f", loss {metrics.get('loss', 0.0):.4f} over "
                                                    f"{metrics.get('num_sequences', 0):.0f} examples")

    def sums(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        return classifier_sums(outputs, features, self.regression)

    def slot_losses(self, outputs: dict, features: dict) -> tf.Tensor:
        """Each example's loss in its slot: float32 [B, S]."""
        return classifier_slot_losses(outputs, features, self.regression)

    def example_outputs(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        """Each slot's example, label and prediction (the class, or the score), and whether it holds
        an example: [B * S] each; and its class probabilities (a regression: its score): [B * S, C]."""
        logits = tf.cast(outputs["logits"], tf.float32)
        predictions = logits[..., 0] if self.regression else tf.cast(tf.argmax(logits, -1), tf.float32)
        probabilities = logits if self.regression else tf.nn.softmax(logits, axis=-1)
        return {**{name: tf.reshape(value, [-1]) for name, value in (
            ("example_ids", features["example_ids"]), ("labels", features["labels"]), ("predictions", predictions),
            ("weights", features["label_weights"]))},
            "probabilities": tf.reshape(probabilities, [-1, self.num_outputs])}

    @staticmethod
    def test_results(examples: dict) -> np.ndarray:
        """Each example's class probabilities (a regression: its score), in its file's order, of an
        evaluation's example_outputs (every batch's, gathered): [N, C], google-research's
        test_results.tsv."""
        held = examples["weights"] > 0
        order = np.argsort(examples["example_ids"][held], kind="stable")
        return examples["probabilities"][held][order]

    def metrics(self, sums: dict, examples: dict | None = None) -> dict[str, float]:
        """The loss and accuracy of summed sums, and with `examples` (example_outputs of every
        batch) the task's scores of their predictions."""
        count = float(sums["examples"])
        metrics = {"loss": float(self.loss(sums)), "num_sequences": count}
        if not self.regression:
            metrics["accuracy"] = float(sums["example_correct"]) / count if count else 0.0
        if examples is not None and count:
            held = examples["weights"] > 0
            metrics.update(glue_scores(self.scores, examples["predictions"][held], examples["labels"][held]))
            if not self.regression:  # what a model that learned nothing scores (curves.at_chance)
                metrics["chance_loss"] = math.log(self.num_outputs)
                metrics["chance_accuracy"] = float(np.bincount(examples["labels"][held].astype(np.int64)).max() /
                                                   held.sum())
        return metrics


def _load_encoder(model: BertEncoder | BertPretrainingModel, path: str) -> str:
    """Pre-trained weights in any format pre-training takes (a run, its training checkpoint or its
    model.ckpt-N, google-research's, a Hugging Face directory) into `model` (an encoder: whatever
    heads they have); returns the checkpoint read (a run's newest, for a run's directory)."""
    read = load_pretraining_checkpoint(model, path)
    if read is None:
        load_weights(model, path)
    return read or path


@dataclasses.dataclass(frozen=True)
class Answering:
    """What turns an evaluation's span logits into answers (finetuning.squad.predict_answers).

    Attributes:
      examples: the predict file's questions.
      windows: their windows, in the order of the evaluation's rows' example_ids.
      n_best_size, max_answer_length: run_squad's flags.
    """

    examples: list[SquadExample]
    windows: Windows
    n_best_size: int
    max_answer_length: int


class SpanPrediction(FineTuningObjective):
    """SQuAD's objective: each sequence's answer span, by a softmax of its start logits and one of
    its end logits over its own tokens, the two cross-entropies halved and averaged over the
    sequences of an update (google-research's run_squad).

    An evaluation turns every window's logits into each question's answer and scores them by
    the official SQuAD v1.1 script's exact match and F1; `answers` keeps them for
    predictions.json.

    Args:
      config: the run's settings.
      answering: the predict file's questions and windows (None: no evaluation).
      identity: what run.json records of the run beside its settings.
    """

    program = "run_squad"
    labels = ()

    def __init__(self, config: TrainConfig, answering: Answering | None = None, identity: dict | None = None):
        self.config = config
        self.answering = answering
        self.identity = identity or {}
        self.answers: tuple[dict, dict] | None = None  # the last evaluation's (predictions, n-best)

    def build_model(self) -> BertQuestionAnsweringModel:
        return BertQuestionAnsweringModel(self.config.model.bert, self.config.model.recompute)

    def load_initial_weights(self, model: BertQuestionAnsweringModel, path: str) -> str:
        """--init_checkpoint's weights: a span model's whole (a run's model.ckpt-N, google-research's
        run_squad output, a BertForQuestionAnswering directory); else pre-trained weights for the
        encoder, the span head starting from random weights. Returns the checkpoint read."""
        if pretraining_run_info(path) is None and holds_span_head(path):
            load_weights(model, path)
            return path
        return _load_encoder(model.encoder, path)

    @staticmethod
    def describe(metrics: dict) -> str:
        windows = f"{metrics.get('num_sequences', 0):.0f} windows"
        if metrics.get("questions_scored") == 0:
            return f"not scored (the file has no answers) over {windows}"
        figures = ", ".join(f"{name.replace('_', ' ')} {metrics[name]:.2f}" for name in ("exact_match", "f1")
                            if name in metrics)
        if "questions_scored" in metrics:
            return f"{figures} over the {metrics['questions_scored']:,} questions with answers ({windows})"
        return f"{figures}{', ' if figures else ''}loss {metrics['loss']:.4f} over {windows}"

    def sums(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        return span_sums(outputs, features)

    @staticmethod
    def slot_losses(outputs: dict, features: dict) -> tf.Tensor:
        """Each window's span loss in its slot: float32 [B, S]."""
        return span_slot_losses(outputs, features)

    def example_outputs(self, outputs: dict, features: dict) -> dict[str, tf.Tensor]:
        """Each slot's window, whether it holds one, and its start and end logits: [B * S] and
        [B * S, L]."""
        length = tf.shape(outputs["start_logits"])[-1]
        return {"example_ids": tf.reshape(features["example_ids"], [-1]),
                "weights": tf.reshape(features["label_weights"], [-1]),
                "start_logits": tf.reshape(outputs["start_logits"], [-1, length]),
                "end_logits": tf.reshape(outputs["end_logits"], [-1, length])}

    def metrics(self, sums: dict, examples: dict | None = None) -> dict[str, float]:
        """The loss of summed sums, and with `examples` (example_outputs of every batch) each
        question's answer (kept in `answers`) and their exact match and F1. When questions of the
        predict file have no answers (a test set's), the evaluation has no loss, and its scores
        are of the `questions_scored` that have."""
        count = float(sums["examples"])
        metrics = {"loss": float(self.loss(sums)), "num_sequences": count}
        if examples is not None and count:  # a model that learned nothing: each start and end uniform on its tokens
            own = (examples["start_logits"][examples["weights"] > 0] > OUTSIDE_THE_SEQUENCE / 2).sum(-1)
            metrics["chance_loss"] = float(np.log(np.maximum(own, 1)).mean())
        if examples is None or not count or self.answering is None:
            return metrics
        scored = sum(1 for example in self.answering.examples if example.answers)
        if scored < len(self.answering.examples):
            # A question without answers is to answer, not to score: its windows' targets are their
            # [CLS], so the evaluation's loss means nothing; the scores are of those with answers.
            del metrics["loss"], metrics["chance_loss"]
            metrics["questions_scored"] = scored
        held = examples["weights"] > 0
        order = np.argsort(examples["example_ids"][held], kind="stable")
        start_logits, end_logits = examples["start_logits"][held][order], examples["end_logits"][held][order]
        answering = self.answering
        self.answers = predict_answers(answering.examples, answering.windows, start_logits, end_logits,
                                       answering.n_best_size, answering.max_answer_length)
        return {**metrics, **squad_scores(answering.examples, self.answers[0])}
