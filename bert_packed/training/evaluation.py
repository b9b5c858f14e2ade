"""Evaluation: the masked-LM and NSP figures over the whole eval set, or --max_eval_steps batches.

Packed and unpacked eval records give the same figures: the sums are per sequence
(bert_packed.training.losses), added over batches and replicas, and divided once. Under
multi-worker training each input pipeline evaluates its share of the records (input_pipeline).
"""

from __future__ import annotations

import tensorflow as tf

from bert_packed.input_pipeline import PipelineConfig, make_dataset, reading_errors_named
from bert_packed.training.config import TrainConfig
from bert_packed.training.losses import metrics_from_sums, pretraining_sums


class Evaluation:
    """Evaluates a model on the run's eval set (the compiled step is built once, so evaluations do
    not retrace)."""

    def __init__(self, config: TrainConfig, model, strategy: tf.distribute.Strategy):
        data, bert = config.eval_data, config.model.bert
        self.pipeline = PipelineConfig(data.files, data.shapes, data.input_mode, data.batch_size, False,
                                       config.run.seed, deterministic=config.run.deterministic,
                                       max_batches=data.max_steps, vocab_size=bert.vocab_size,
                                       type_vocab_size=bert.type_vocab_size, plan=data.plan,
                                       window=data.online_packing_window)
        self._loss_averaging = config.model.loss_averaging
        self._model = model
        self._strategy = strategy
        self._step = tf.function(self._step_fn)

    def __call__(self) -> dict:
        """The metrics (bert_packed.training.losses.metrics_from_sums); {} without eval files."""
        totals = None
        with reading_errors_named(self.pipeline):
            for features in self._strategy.distribute_datasets_from_function(
                    lambda context: make_dataset(self.pipeline, context)):
                sums = self._step(features)
                totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        return metrics_from_sums(totals, self._loss_averaging) if totals else {}

    def _step_fn(self, features):
        def replica(features):
            return pretraining_sums(self._model(features, training=False), features)

        sums = self._strategy.run(replica, args=(features,))
        return {k: self._strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}
