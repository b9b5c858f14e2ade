"""The compiled update: each micro-batch's gradients, their accumulation, the clip and the apply.

This is the one place where gradients are clipped (the optimizer is built without a clip of its
own). An update is `steps_per_update` micro-batches; `iterations_per_loop` micro-steps run in one
compiled call with no host reads inside, and the host reads each update's sums once the call is
done.

Gradient clipping, two orders (both allowed by the MLPerf rules):
  before the all-reduce (the reference's default)  each replica clips the gradient of each of its
      micro-batches (its loss normalised by its own counts), and the update averages them.
  after the all-reduce  the counts that normalise the losses are summed over the whole update
      first (they come from the features alone), the gradients are summed over micro-batches and
      replicas, and that one gradient is clipped: the update of one big batch.

Dropout's masks come from a seed of (the run's seed, the micro-step, the replica): a resumed run,
a repeated one and a backward pass that recomputes a block draw the same masks.
"""

from __future__ import annotations

import operator

import keras
import tensorflow as tf

from bert_packed.errors import InternalError
from bert_packed.model.modeling import fold_seed
from bert_packed.training.batching import Batching
from bert_packed.training.config import TrainConfig
from bert_packed.training.optimizers import AdamWeightDecay, Lamb, PolynomialWarmup

# What one update returns after its learning rate and its objective's sums (Update.sum_keys):
# the token counts of the rows, and the norm of the gradient applied.
UPDATE_KEYS = ("tokens", "slots", "gradient_norm")
# The global gradient norm clipped to: the MLPerf reference's 1.0.
CLIP_NORM = 1.0


def make_schedule(config: TrainConfig, batching: Batching) -> PolynomialWarmup:
    """The reference learning-rate schedule of the run, in micro-steps."""
    o = config.optimizer
    return PolynomialWarmup(o.learning_rate, o.num_train_steps, o.num_warmup_steps, o.start_warmup_step,
                            o.poly_power, batching.steps_per_update)


def make_optimizer(config: TrainConfig, batching: Batching, schedule: PolynomialWarmup):
    """LAMB or AdamW on `schedule` with the run's betas (adjusted for packing if asked), without a
    clip of its own, each weight's step XLA-compiled with --xla; inside a LossScaleOptimizer with
    fp16."""
    o = config.optimizer
    beta_1, beta_2 = batching.betas
    kind = {"lamb": Lamb, "adamw": AdamWeightDecay}[o.optimizer]
    optimizer = kind(schedule, beta_1=beta_1, beta_2=beta_2, epsilon=o.epsilon,
                     weight_decay_rate=o.lamb_weight_decay_rate, fused=config.model.xla)
    if config.model.precision == "fp16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class Update:
    """Updates of a model under a tf.distribute strategy.

    Attributes:
      model: the BertPretrainingModel.
      optimizer: from make_optimizer (a LossScaleOptimizer with fp16).
      optimizer_itself: LAMB or AdamW (inside the LossScaleOptimizer with fp16).
      sum_keys: what an update reports after its learning rate: the objective's sums, then
        UPDATE_KEYS.
      loop: the compiled call: loop(iterator, num_updates) -> [num_updates, 1 + len(sum_keys)],
        each update's learning rate and sums (fewer rows when stop_requested was set meanwhile).
      stop_requested: a flag the loop reads before each update.
      one_update: one update of one micro-batch as one XLA program, one_update(features,
        dropout_seeds(first_micro_step, 1)) -> {"learning_rate", *sum_keys}: what the loop does at
        --steps_per_update=1 on one replica, for export (training/export_update.py).
    """

    def __init__(self, config: TrainConfig, batching: Batching, model, optimizer, strategy: tf.distribute.Strategy,
                 step: tf.Variable, objective):
        self.model = model
        self.objective = objective  # objective.Pretraining or Classification
        self.sum_keys = objective.sum_keys + UPDATE_KEYS
        self.optimizer = optimizer
        self._loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.optimizer_itself = optimizer.inner_optimizer if self._loss_scaled else optimizer
        self._strategy = strategy
        self._steps_per_update = batching.steps_per_update
        self._clip_after_allreduce = config.optimizer.clip_by_global_norm_after_gradient_allreduce
        self._step = step  # micro-steps done before the compiled call
        self._seed = tf.constant([config.run.seed % 2**31, config.run.seed // 2**31 % 2**31], tf.int32)
        # A function of its own, called once a micro-batch: traced once however many micro-batches
        # an update holds (its forward and backward pass are most of the update's operations).
        self._gradients = tf.function(self._gradients_fn, jit_compile=True if config.model.xla else None,
                                      autograph=False)
        # Set (to 1) by a signal while a compiled loop runs (loop.Stop): the loop ends after the
        # update in hand, on every worker after the same update (each update sums the flags).
        self.stop_requested = tf.Variable(0, dtype=tf.int32, trainable=False, name="stop_requested")
        # The one function AutoGraph converts (its `for` over tf.range, its `break`); the others are
        # traced as written: converting their source cost a run about 2 s at its start.
        self.loop = tf.function(self._loop_fn)
        # One whole update as one XLA program, its variables updated in place: what another XLA
        # runs without TensorFlow (training/export_update.py). The loop does not call it.
        self.one_update = tf.function(self._one_update_fn, jit_compile=True, autograph=False)

    def _loop_fn(self, iterator, num_updates):
        results = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[1 + len(self.sum_keys)])
        for index in tf.range(num_updates):
            requests = self._strategy.run(lambda: tf.identity(self.stop_requested))
            if self._strategy.reduce(tf.distribute.ReduceOp.SUM, requests, axis=None) > 0:
                break
            learning_rate = tf.cast(self.optimizer_itself.learning_rate, tf.float32)
            batches = [next(iterator) for _ in range(self._steps_per_update)]
            first_micro_step = self._step + tf.cast(index, tf.int64) * self._steps_per_update
            sums = self._strategy.run(self._replica_update, args=(batches, first_micro_step))
            sums = {k: self._strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}
            results = results.write(index, tf.stack([learning_rate] + [sums[k] for k in self.sum_keys]))
        return results.stack()

    def dropout_seeds(self, first_micro_step, count: int, replica_id=0) -> tf.Tensor:
        """The dropout seeds of `count` micro-batches from `first_micro_step` on a replica: int32
        [count, 2]. Drawn by TensorFlow's own kernels outside any XLA program, as the loop draws
        them (XLA's Philox gives other numbers of the same seed)."""
        return tf.stack([fold_seed(self._seed, tf.cast(first_micro_step + k, tf.int32), replica_id)
                         for k in range(count)])

    def _one_update_fn(self, features, seeds):
        """The update the loop makes of one micro-batch on this replica (--steps_per_update=1): its
        learning rate, then its sums and the gradient's norm (`sum_keys`). `seeds` (int32 [1, 2],
        dropout_seeds) picks the dropout masks, as the loop's micro-step count does."""
        if self._steps_per_update != 1:
            raise InternalError(f"one_update is the update of one micro-batch; this step accumulates "
                                f"{self._steps_per_update}")
        learning_rate = tf.cast(self.optimizer_itself.learning_rate, tf.float32)
        return {"learning_rate": learning_rate, **self._apply_update([features], seeds)}

    def _scale(self):
        """The loss scale of fp16 (1 otherwise)."""
        return tf.cast(self.optimizer.dynamic_scale, tf.float32) if self._loss_scaled else 1.0

    @tf.autograph.experimental.do_not_convert  # plain Python over lists: the loop's own converted code stops here
    def _replica_update(self, batches, first_micro_step):
        context = tf.distribute.get_replica_context()
        seeds = self.dropout_seeds(first_micro_step, len(batches), context.replica_id_in_sync_group)
        return self._apply_update(batches, seeds)

    def _apply_update(self, batches, seeds):
        """One update of `batches` on this replica, each micro-batch's dropout drawn from its row
        of `seeds` (int32 [steps_per_update, 2]): its sums and the gradient's norm."""
        context = tf.distribute.get_replica_context()
        variables = self.model.trainable_variables
        replicas = context.num_replicas_in_sync
        if self._clip_after_allreduce:
            counts = {}
            for features in batches:
                for name, value in self.objective.counts(features).items():
                    counts[name] = counts.get(name, 0.0) + value
            counts = {k: context.all_reduce(tf.distribute.ReduceOp.SUM, v) for k, v in counts.items()}
            gradients, totals = self._accumulated(batches, counts, seeds)
            # Each replica's loss is divided by the global counts, so the replicas' gradients add up
            # to the global gradient: all-reduce and clip it here.
            gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            gradients, _ = tf.clip_by_global_norm(_by(operator.truediv, gradients, self._scale()), CLIP_NORM)
            gradients = _by(operator.truediv, gradients, replicas)
        else:
            gradients, totals = self._accumulated(batches, None, seeds)
            gradients = _by(operator.truediv, gradients, len(batches) * replicas)
        # Keras sums what each replica hands it.
        self.optimizer.apply_gradients(zip(_by(operator.mul, gradients, self._scale()), variables))
        totals["gradient_norm"] = tf.linalg.global_norm(gradients)  # checked (finite) by the host
        return totals

    def _accumulated(self, batches, counts, seeds):
        """The micro-batches' gradients and sums, added up (`seeds`: int32 [steps_per_update, 2],
        each micro-batch's dropout seed).

        One compiled call a micro-batch, each after the one before: a replica holds one
        micro-batch's activations at a time. One XLA program of every micro-batch would schedule
        their forward passes together (two micro-batches of base at L=512 took 8.4 GiB against
        4.6 GiB for one, measured), and accumulation would save no memory.
        """
        gradients, totals = None, None
        for features, seed in zip(batches, tf.unstack(seeds)):
            with tf.control_dependencies(gradients or []):
                micro, sums = self._gradients(features, counts, seed)
            if gradients is None:
                gradients, totals = micro, sums
            else:
                gradients = [g + d for g, d in zip(gradients, micro)]
                totals = {name: totals[name] + value for name, value in sums.items()}
        return gradients, totals

    def _gradients_fn(self, features, counts, seed):
        """One micro-batch's gradients and sums (XLA-compiled with --xla), its dropout drawn from
        `seed` (int32 [2]).

        With `counts`, the loss is divided by those (an update's global counts) and the gradient
        returned loss-scaled; without, by the micro-batch's own counts, and the gradient is
        unscaled and clipped.
        """
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            sums = self.objective.sums(self.model(features, training=True, dropout_seed=seed), features)
            loss = self.objective.loss(sums, counts)
            if self._loss_scaled:
                loss = self.optimizer.scale_loss(loss)
        gradients = [tf.convert_to_tensor(d) for d in tape.gradient(loss, variables)]
        if counts is None:
            gradients, _ = tf.clip_by_global_norm(_by(operator.truediv, gradients, self._scale()), CLIP_NORM)
        sums["tokens"] = tf.reduce_sum(tf.cast(features["sequence_ids"] > 0, tf.float32))
        sums["slots"] = tf.cast(tf.size(features["sequence_ids"]), tf.float32)
        return gradients, sums


def _by(operation, tensors: list, operand) -> list:
    """operation(tensor, operand) for each of `tensors` (a division or a multiplication), or the
    tensors themselves where `operand` is the number 1 (`_scale()` without loss scaling, one
    replica, one micro-batch): such a step changes nothing but is still a pass over every weight's
    gradient, and a node of the graph a step's build traces, where no graph optimizer takes it out
    (the tests run without one)."""
    if isinstance(operand, (int, float)) and operand == 1:
        return list(tensors)
    return [operation(tensor, operand) for tensor in tensors]
