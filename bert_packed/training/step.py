"""The compiled step: what is built once per graph shape and reused by every run of that shape.

A graph shape is the model (its BERT config, precision, XLA, loss basis), the optimizer (its
kind, betas, decay, epsilon and the schedule's power), the tf.distribute strategy, and the
micro-batch (rows, the micro-batches an update accumulates, the clip order). What a run adds
(its data files, output directory, resume point, logs and cadences, and the schedule's peak and
lengths, which are variables) is not part of it: bert_packed.training.loop runs a CompiledStep
on them. So a run, an evaluation alone, a throughput benchmark and a test share one way of
building and calling the compiled update, and a step built once serves several runs of one
shape (`initial_state` and `reset` put it back as new, `set_schedule` gives it a run's schedule).

Commands run one after another in one process (the main job, the fine-tuning job, a notebook,
the tests) share them through a StepPool (step_pool.py) that the caller owns and passes to each.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bert_packed.storage.run_directory import LOGS
from bert_packed.training.batching import batching
from bert_packed.training.config import TrainConfig
from bert_packed.training.data import TrainData
from bert_packed.training.input_pipeline import PipelineConfig, make_dataset, reading_errors_named
from bert_packed.training.objective import Pretraining
from bert_packed.training.process import check_process_set_up
from bert_packed.training.update import Update, make_optimizer, make_schedule


class CompiledStep:
    """The model, its optimizer and the compiled update and evaluation, under a strategy.

    Args:
      config: the run's settings.
      train_data: the training data's description (its input mode and packing factor size the
        micro-batch and set the betas).
      strategy: the tf.distribute strategy (default: the current one).
      objective: what the model is trained to do (objective.Pretraining, the default, or
        Classification).

    Attributes:
      config: the settings it was built for.
      objective: its objective.
      batching: what one update holds (config.Batching: rows, accumulation, betas).
      strategy: the tf.distribute strategy.
      model: the objective's model (a BertPretrainingModel or BertClassifierModel).
      schedule: the learning-rate schedule (optimizers.PolynomialWarmup).
      optimizer: its optimizer (a LossScaleOptimizer with fp16).
      update: the compiled update (update.loop).
      step, sequences: micro-steps done and sequences seen (checkpointed).
      log_sizes: the run's logs' sizes when its checkpoint was saved (a resumed run cuts them back).
      state: what a checkpoint holds (a tf.train.Checkpoint).
    """

    def __init__(self, config: TrainConfig, train_data: TrainData, strategy: tf.distribute.Strategy | None = None,
                 objective=None):
        strategy = strategy or tf.distribute.get_strategy()
        check_process_set_up(config)
        self.config, self.strategy = config, strategy
        self.objective = objective or Pretraining(config)
        self.batching = batching(config, train_data.input_mode, train_data.packing_factor,
                                 train_data.shapes.max_sequences_per_pack, strategy.num_replicas_in_sync)
        with strategy.scope():
            self.model = self.objective.build_model()
            self.model.build()
            self.schedule = make_schedule(config, self.batching)
            self.optimizer = make_optimizer(config, self.batching, self.schedule)
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.sequences = tf.Variable(0, dtype=tf.int64, trainable=False, name="sequences")
            self.log_sizes = tf.Variable([0] * len(LOGS), dtype=tf.int64, trainable=False, name="log_sizes")
        self.update = Update(config, self.batching, self.model, self.optimizer, strategy, self.step, self.objective)
        self._evaluate_batch = tf.function(self._evaluate_batch_fn, autograph=False)
        self.state = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step,
                                         sequences=self.sequences, log_sizes=self.log_sizes)

    def run_updates(self, iterator, num_updates: int) -> np.ndarray:
        """Runs `num_updates` updates on batches of `iterator` in one compiled call.

        Returns:
          [num_updates, 1 + len(update.sum_keys)]: each update's learning rate and sums.
        """
        return self.update.loop(iterator, tf.constant(num_updates)).numpy()

    def train_iterator(self, pipeline: PipelineConfig):
        """An iterator over the micro-batches of `pipeline`, distributed over the replicas."""
        return iter(self.strategy.distribute_datasets_from_function(lambda context: make_dataset(pipeline, context)))

    def evaluate(self, pipeline: PipelineConfig) -> dict | None:
        """The metrics over the batches of `pipeline` (its objective's); {} when it has none;
        None when a signal came meanwhile (Update.stop_requested, summed over the replicas with each
        batch, so that every worker abandons it after the same batch).

        Packed and unpacked eval records give the same figures: the sums are per sequence, added
        over batches and replicas, and divided once; what the objective scores example by example
        (a fine-tuning task's F1, say) is gathered from every replica first. Under multi-worker
        training each input pipeline evaluates its share of the records (input_pipeline).
        """
        evaluated = self.outputs(pipeline)
        if evaluated is None:
            return None
        totals, gathered = evaluated
        return self.objective.metrics(totals, gathered) if totals else {}

    def outputs(self, pipeline: PipelineConfig) -> tuple[dict, dict] | None:
        """(the sums over the batches of `pipeline`, what the objective outputs example by example,
        gathered from every replica and batch: {name: [N, ...]}); ({}, {}) for no batch; None when a
        signal came meanwhile (as evaluate's)."""
        totals, examples = None, []
        with reading_errors_named(pipeline):
            batches = self.strategy.distribute_datasets_from_function(lambda context: make_dataset(pipeline, context))
            # Traced for any number of rows (the last batch is short), so each batch calls the one trace.
            self._evaluate_batch.get_concrete_function(batches.element_spec)
            for features in batches:
                sums, per_example = self._evaluate_batch(features)
                if int(sums.pop("stop_requests")):
                    return None
                totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
                examples.append({name: value.numpy() for name, value in per_example.items()})
        if not totals:
            return {}, {}
        return totals, {name: np.concatenate([batch[name] for batch in examples]) for name in examples[0]}

    def _evaluate_batch_fn(self, features):
        def replica(features):
            outputs = self.model(features, training=False)
            sums = {**self.objective.sums(outputs, features), "stop_requests": tf.identity(self.update.stop_requested)}
            return sums, self.objective.example_outputs(outputs, features)

        sums, per_example = self.strategy.run(replica, args=(features,))
        return ({k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()},
                {k: self.strategy.gather(v, axis=0) for k, v in per_example.items()})

    def _variables(self) -> list:
        return [*self.model.variables, *self.optimizer.variables, self.step, self.sequences, self.log_sizes]

    def initial_state(self) -> list[np.ndarray]:
        """Every variable's value now (weights, optimizer slots, counters)."""
        return [v.numpy() for v in self._variables()]

    def set_schedule(self, config: TrainConfig) -> None:
        """Gives the step the learning-rate schedule of `config` (its peak and step counts)."""
        o = config.optimizer
        self.schedule.set(o.learning_rate, o.num_train_steps, o.num_warmup_steps, o.start_warmup_step)

    def reset(self, state: list[np.ndarray]) -> None:
        """Puts back every variable's value of `state` (from initial_state), and no stop requested:
        the step is then as built, and compiles nothing again."""
        for variable, value in zip(self._variables(), state, strict=True):
            variable.assign(value)
        self.update.stop_requested.assign(0)  # a signal may have come after its run let it go
