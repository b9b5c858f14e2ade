"""LAMB with the MLPerf reference semantics, and BERT's original AdamW, as Keras 3 optimizers.

Per variable w with gradient g, at update t (1-based), after clipping all gradients to global
norm `clip_norm` when one is given (training does not give one: bert_packed.training.update
clips, in the order the run asks for):
  m = beta_1 m + (1 - beta_1) g;   v = beta_2 v + (1 - beta_2) g^2
  LAMB:  u = (m / (1 - beta_1^t)) / (sqrt(v / (1 - beta_2^t)) + epsilon)     (bias-corrected)
  AdamW: u = m / (sqrt(v) + epsilon)                                       (no bias correction)
  u += weight_decay_rate * w            unless w's path matches exclude_from_weight_decay
  r = ||w|| / ||u||  (1 where either norm is 0)   LAMB, unless w matches exclude_from_layer_adaptation
  w -= learning_rate * r * u
Weight decay sits inside the update, before the trust ratio, as in the MLPerf reference (not
Keras' decoupled `weight_decay`). Exclusions are regular expressions searched in the variable's
path; by default LayerNorm weights and biases are excluded from both. docs/training.md has the
schedule and the reference's semantics in full.

For packed data, the betas raised to the power of the packing factor keep the momentum horizon
of pf unpacked steps: bert_packed.training.batching.adjusted_betas.
"""

from __future__ import annotations

import re

import keras
import tensorflow as tf
from keras import ops

from bert_packed.errors import SettingsError

DEFAULT_EXCLUSIONS = ("LayerNorm", "layer_norm", "bias")


class _BertOptimizer(keras.optimizers.Optimizer):
    """The shared update; LAMB and AdamW differ in bias correction and the trust ratio."""

    bias_correction = True
    layer_adaptation = True

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay_rate=0.01,
                 exclude_from_weight_decay=DEFAULT_EXCLUSIONS, exclude_from_layer_adaptation=None,
                 clip_norm=None, fused=False, name=None, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name or type(self).__name__.lower(),
                         global_clipnorm=clip_norm, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.weight_decay_rate = weight_decay_rate
        self.exclude_from_weight_decay = tuple(exclude_from_weight_decay or ())
        self.exclude_from_layer_adaptation = tuple(
            self.exclude_from_weight_decay if exclude_from_layer_adaptation is None else exclude_from_layer_adaptation)
        self.clip_norm = clip_norm
        self.fused = fused
        # A weight's step is traced once a kind (decayed, adapted), dtype and replica device,
        # whatever the weight's shape (its signature leaves the shape open), not once a weight or a
        # shape: it holds no state of its own (the variables are assigned outside it), and the
        # graph inlines it. Traced once a shape, the tiny model's 26 weights took 13 traces.
        # Fused, each is one XLA program, compiled for each shape it runs on: its moments, update
        # and trust ratio in one pass over memory instead of an operation a pass (AdamW's step over
        # BERT-base's weights: 176 ms instead of 364 ms on a 2-core CPU,
        # scripts/benchmark_optimizer.py). Pure arithmetic, so it compiles under any strategy.
        self._steps = {}

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._velocities = [self.add_variable_from_reference(v, "v") for v in var_list]
        # update_step may see the backend variable, which has no Keras path: decide here.
        self._decayed = [not self._matches(v.path, self.exclude_from_weight_decay) for v in var_list]
        self._adapted = [not self._matches(v.path, self.exclude_from_layer_adaptation) for v in var_list]

    @staticmethod
    def _matches(path: str, patterns) -> bool:
        return any(re.search(pattern, path) for pattern in patterns)

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        dtype = variable.dtype
        step = self._step_of(bool(self.weight_decay_rate) and self._decayed[index],
                             self.layer_adaptation and self._adapted[index], dtype)
        new_m, new_v, delta = step(ops.cast(gradient, dtype), tf.convert_to_tensor(m), tf.convert_to_tensor(v),
                                   tf.convert_to_tensor(variable), ops.cast(learning_rate, dtype),
                                   ops.cast(self.iterations + 1, dtype))
        self.assign(m, new_m)
        self.assign(v, new_v)
        self.assign_sub(variable, delta)

    def _step_of(self, decayed: bool, adapted: bool, dtype):
        """The compiled step of a weight of this kind and dtype, traced at its first use."""
        key = (decayed, adapted, tf.as_dtype(dtype))
        if key not in self._steps:
            tensor, scalar = tf.TensorSpec(None, key[2]), tf.TensorSpec([], key[2])

            def weight_step(gradient, m, v, variable, learning_rate, step):
                return self._step_fn(gradient, m, v, variable, learning_rate, step, decayed, adapted)

            self._steps[key] = tf.function(weight_step, input_signature=[tensor] * 4 + [scalar] * 2,
                                           jit_compile=True if self.fused else None, autograph=False)
        return self._steps[key]

    def _step_fn(self, gradient, m, v, variable, learning_rate, step, decayed: bool, adapted: bool):
        """One weight's step (module docstring): its new moments, and what is taken off it."""
        dtype = variable.dtype
        beta_1, beta_2 = ops.cast(self.beta_1, dtype), ops.cast(self.beta_2, dtype)
        m = m * beta_1 + gradient * (1.0 - beta_1)
        v = v * beta_2 + ops.square(gradient) * (1.0 - beta_2)
        if self.bias_correction:
            update = (m / (1.0 - ops.power(beta_1, step))) / (ops.sqrt(v / (1.0 - ops.power(beta_2, step))) + self.epsilon)
        else:
            update = m / (ops.sqrt(v) + self.epsilon)
        if decayed:
            update = update + self.weight_decay_rate * variable
        ratio = 1.0
        if adapted:
            weight_norm, update_norm = ops.norm(ops.reshape(variable, [-1])), ops.norm(ops.reshape(update, [-1]))
            ratio = ops.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
        return m, v, learning_rate * ratio * update

    def get_config(self):
        config = super().get_config()
        config.pop("global_clipnorm", None)
        return {**config, "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "weight_decay_rate": self.weight_decay_rate,
                "exclude_from_weight_decay": list(self.exclude_from_weight_decay),
                "exclude_from_layer_adaptation": list(self.exclude_from_layer_adaptation),
                "clip_norm": self.clip_norm, "fused": self.fused}


class Lamb(_BertOptimizer):
    """LAMB as the MLPerf BERT reference runs it (bias correction, trust ratio); see module doc."""


class AdamWeightDecay(_BertOptimizer):
    """google-research/bert's AdamWeightDecayOptimizer: no bias correction, no trust ratio."""

    bias_correction = False
    layer_adaptation = False


class PolynomialWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """The reference learning rate: polynomial decay from step 0, overridden by linear warmup.

    lr(step) = init_lr * (1 - min(step, num_train_steps) / num_train_steps) ** power, except while
    step - start_warmup_step < num_warmup_steps, where it is
    init_lr * (step - start_warmup_step) / num_warmup_steps (never below 0). A negative
    start_warmup_step starts partway through warmup. Steps are the reference's micro-steps: called
    with the optimizer's update count u, the schedule is evaluated at u * steps_per_update.

    init_lr and the three step counts are variables (`set` changes them), so one compiled update
    serves runs of any length; power and steps_per_update are part of the graph.

    >>> schedule = PolynomialWarmup(1e-3, num_train_steps=100, num_warmup_steps=10)
    >>> [round(float(schedule(s)), 6) for s in (0, 5, 10, 55, 100)]
    [0.0, 0.0005, 0.0009, 0.00045, 0.0]
    >>> schedule.set(1e-3, num_train_steps=50)
    >>> [round(float(schedule(s)), 6) for s in (0, 5, 10, 55, 100)]
    [0.001, 0.0009, 0.0008, 0.0, 0.0]
    """

    def __init__(self, init_lr, num_train_steps, num_warmup_steps=0, start_warmup_step=0, power=1.0,
                 steps_per_update=1):
        super().__init__()
        if steps_per_update < 1:
            raise SettingsError(f"steps_per_update must be >= 1, got {steps_per_update}")
        self.power = power
        self.steps_per_update = steps_per_update
        self._values = {name: keras.Variable(0.0, dtype="float32", trainable=False, name=name)
                        for name in ("init_lr", "num_train_steps", "num_warmup_steps", "start_warmup_step")}
        self.set(init_lr, num_train_steps, num_warmup_steps, start_warmup_step)

    def set(self, init_lr, num_train_steps, num_warmup_steps=0, start_warmup_step=0) -> None:
        """Sets the peak learning rate and the step counts (raises SettingsError on impossible ones)."""
        if num_train_steps < 1 or num_warmup_steps < 0:
            raise SettingsError(f"num_train_steps must be >= 1 and num_warmup_steps >= 0, "
                                f"got {num_train_steps} and {num_warmup_steps}")
        values = dict(init_lr=init_lr, num_train_steps=num_train_steps, num_warmup_steps=num_warmup_steps,
                      start_warmup_step=start_warmup_step)
        for name, value in values.items():
            self._values[name].assign(float(value))

    @property
    def variables(self) -> dict:
        """{name: variable} of the values `set` sets (init_lr and the three step counts)."""
        return dict(self._values)

    def __call__(self, step):
        init_lr, total, warmup, start = (self._values[name] for name in (
            "init_lr", "num_train_steps", "num_warmup_steps", "start_warmup_step"))
        step = ops.cast(step, "float32") * float(self.steps_per_update)
        # Times the reciprocal: TensorFlow's graph optimizer computed a division by a constant so,
        # and the rates stay those of the schedule's constants to the bit.
        done = ops.minimum(step, total) * ops.reciprocal(total)
        learning_rate = init_lr * ops.power(1.0 - done, self.power)
        warm = step - start
        # max(warmup, 1): without warmup the ratio is not selected, and stays finite.
        warmup_rate = ops.maximum(init_lr * warm * ops.reciprocal(ops.maximum(warmup, 1.0)), 0.0)
        return ops.where((warm < warmup) & (warmup > 0), warmup_rate, learning_rate)

    def get_config(self):
        values = {name: float(ops.convert_to_numpy(v)) for name, v in self._values.items()}
        for name in ("num_train_steps", "num_warmup_steps", "start_warmup_step"):
            values[name] = int(values[name])
        return {**values, "power": self.power, "steps_per_update": self.steps_per_update}
