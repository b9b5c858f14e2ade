"""Compiled steps kept for reuse (StepPool): an object its owner (a job, a notebook, the tests)
makes and passes to each command it runs, so that the runs of one graph shape compile once.
Nothing of it lives in module state: a command given no pool makes its own. It loads TensorFlow
only when a step is taken, so that a caller may hold one before it knows whether it trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from bert_packed.training.batching import batching
from bert_packed.training.config import TrainConfig

if TYPE_CHECKING:
    from bert_packed.training.data import TrainData
    from bert_packed.training.step import CompiledStep


# Released steps are kept while their variables and their values as built take at most this (on
# a GPU, half of it in its memory): the tiny and small models of the main job and the tests, not a
# BERT-base's 2.6 GB with its optimizer's slots (where a compile costs less beside the run, and the
# memory is the user's). TensorFlow's traces of a step add about 40 MB that this does not count.
KEPT_BYTES = 2**30


def graph_shape(config: TrainConfig, train_data: TrainData, strategy, objective) -> tuple:
    """What a compiled step is built from: everything but what a run gives it (its data, output
    directory, cadences and logs, and the schedule's peak and lengths, which are variables). The
    device scope it is taken under too (`with tf.device(...)`: the doctor's check on the first
    GPU, a notebook's cell): a step's variables and graph stay on the device they were built on."""
    from tensorflow.python.eager import context

    schedule = dataclasses.replace(config.optimizer, learning_rate=0.0, num_train_steps=1, num_warmup_steps=0,
                                   start_warmup_step=0)
    shape = batching(config, train_data.input_mode, train_data.packing_factor,
                     train_data.shapes.max_sequences_per_pack, strategy.num_replicas_in_sync)
    return (repr(dataclasses.replace(config.model, init_checkpoint=None)), repr(schedule), repr(shape),
            train_data.input_mode, config.run.seed, config.run.deterministic, id(strategy), type(objective).__name__,
            objective.graph_shape, context.context().device_name)


class StepPool:
    """Compiled steps kept for the next run of their graph shape: an object its owner (a job, a
    notebook, the tests) makes and passes to each command it runs, so that runs of one shape
    compile once. A command given none makes its own, and nothing outlives it.

        steps = StepPool()
        first = run_pretraining(settings, steps)   # compiles
        second = run_pretraining(other, steps)     # of the same shape: compiles nothing

    A step is kept with its weights as built and handed out again with them: take one right after
    the process set-up of its run (set_up_process), as the commands do, so that they are the
    weights a new process draws for that seed, whichever run built it.

    Args:
      kept_bytes: released steps are kept while their variables and their values as built take
        at most this many bytes (the oldest let go first).
      strategies_kept: keep a step under a tf.distribute strategy other than the default one. A
        command makes its own strategy (a step's graph shape holds the strategy object), which no
        later command runs under, so such a step is let go with its command, unless the owner
        runs its steps under strategies it keeps (the tests do).
    """

    def __init__(self, kept_bytes: int = KEPT_BYTES, strategies_kept: bool = False):
        self.kept_bytes, self.strategies_kept = kept_bytes, strategies_kept
        # (graph shape, step, its variables as built): those released, oldest first, and those
        # handed out (None for the variables: too big to keep).
        self._free: list[tuple[tuple, CompiledStep, list[np.ndarray]]] = []
        self._held: list[tuple[tuple, CompiledStep, list[np.ndarray] | None]] = []

    def take(self, config: TrainConfig, train_data: TrainData, strategy=None, objective=None) -> CompiledStep:
        """A compiled step for a run of `config`, as CompiledStep(...) builds it: one released
        earlier for the same graph shape (its variables put back as built, this run's schedule
        and objective given; nothing is compiled again), else a new one. It is held until
        release(step).

        Args: as CompiledStep's.
        """
        import tensorflow as tf

        from bert_packed.training.objective import Pretraining
        from bert_packed.training.process import check_process_set_up
        from bert_packed.training.step import CompiledStep

        strategy = strategy or tf.distribute.get_strategy()
        objective = objective or Pretraining(config)
        key = graph_shape(config, train_data, strategy, objective)
        for index, (free_key, step, state) in enumerate(self._free):
            if free_key == key:
                del self._free[index]
                check_process_set_up(config)
                step.reset(state)
                step.set_schedule(config)
                step.config, step.objective, step.update.objective = config, objective, objective
                break
        else:
            step = CompiledStep(config, train_data, strategy, objective)
            state = step.initial_state() if _kept_bytes(step) <= self.kept_bytes else None
        self._held.append((key, step, state))
        return step

    @contextlib.contextmanager
    def holding(self, config: TrainConfig, train_data: TrainData, strategy=None, objective=None):
        """take()'s step for the `with` block, released after it, however it ends."""
        step = self.take(config, train_data, strategy, objective)
        try:
            yield step
        finally:
            self.release(step)

    def release(self, step: CompiledStep | None = None) -> None:
        """Ends the hold on `step` (None: on every step held): it is kept for the next run of
        its graph shape, while the kept ones take at most kept_bytes."""
        import tensorflow as tf

        released = [entry for entry in self._held if step is None or entry[1] is step]
        self._held = [entry for entry in self._held if entry not in released]
        default = tf.distribute.get_strategy()
        self._free.extend(entry for entry in released
                          if entry[2] is not None and (self.strategies_kept or entry[1].strategy is default))
        while sum(_kept_bytes(kept) for _, kept, _ in self._free) > self.kept_bytes:
            self._free.pop(0)

    def held(self) -> list[CompiledStep]:
        """The steps handed out and not released."""
        return [step for _, step, _ in self._held]

    def kept(self) -> list[CompiledStep]:
        """The steps released and kept, oldest first."""
        return [step for _, step, _ in self._free]


def pool_or_own(step_pool: StepPool | None) -> StepPool:
    """The caller's pool, or a pool of the call's own (None); anything else refused before any work
    (a step count given for the pool, say).

    Raises:
      TypeError: `step_pool` is not a StepPool.
    """
    if step_pool is None:
        return StepPool()
    if not isinstance(step_pool, StepPool):
        raise TypeError(f"step_pool={step_pool!r}: expected a StepPool (compiled steps kept for reuse) or None; "
                        f"the number of steps is a setting (num_train_steps, num_train_epochs)")
    return step_pool


def _kept_bytes(step: CompiledStep) -> int:
    """What keeping `step` takes: its variables, and their values as built."""
    import tensorflow as tf

    return 2 * sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in step._variables())
