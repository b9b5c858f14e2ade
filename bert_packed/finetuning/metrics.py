"""GLUE's scores of a task's predictions: accuracy, F1, Matthews correlation, Pearson, Spearman.

They are computed once over every example of an evaluation (F1 and the correlations do not
add up over batches), from each example's prediction, however the examples were packed.
"""

from __future__ import annotations

import numpy as np

from bert_packed.errors import InternalError
from bert_packed.finetuning.tasks import ACCURACY, F1, MATTHEWS, PEARSON, SPEARMAN


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """The share of predictions equal to their labels."""
    return float(np.mean(predictions == labels))


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """F1 of class 1 (MRPC's and QQP's positive class): 2 TP / (2 TP + FP + FN); 0 with no TP.

    >>> f1(np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0]))
    0.5
    """
    true_positive = np.sum((predictions == 1) & (labels == 1))
    wrong = np.sum(predictions != labels)
    return float(2 * true_positive / (2 * true_positive + wrong)) if true_positive else 0.0


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation (CoLA's score), over any number of classes; 0 where it is undefined
    (every label or every prediction the same class).

    >>> matthews_corrcoef(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]))
    0.5773502691896258
    """
    classes = np.union1d(predictions, labels)
    confusion = np.array([[np.sum((labels == t) & (predictions == p)) for p in classes] for t in classes],
                         dtype=np.float64)
    total, correct = confusion.sum(), np.trace(confusion)
    true_counts, predicted_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    denominator = np.sqrt((total ** 2 - predicted_counts @ predicted_counts) * (total ** 2 - true_counts @ true_counts))
    return float((correct * total - true_counts @ predicted_counts) / denominator) if denominator else 0.0


def _correlation(name: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    import scipy.stats  # here, not at the top: 0.8-0.9 s of every training command's start-up

    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0  # undefined for a constant side
    return float(getattr(scipy.stats, name)(predictions, labels)[0])


SCORES = {
    ACCURACY: accuracy,
    F1: f1,
    MATTHEWS: matthews_corrcoef,
    PEARSON: lambda p, t: _correlation("pearsonr", p, t),
    SPEARMAN: lambda p, t: _correlation("spearmanr", p, t),
}


def scores(metrics: tuple[str, ...], predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Each of `metrics` (tasks.Task.metrics) of predictions against labels (class indices, or
    scores for a regression), one value a metric."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim != 1 or predictions.shape != labels.shape or not len(labels):
        raise InternalError(f"scores of predictions {predictions.shape} against labels {labels.shape}: expected "
                            f"one of each an example")
    return {name: SCORES[name](predictions, labels) for name in metrics}
