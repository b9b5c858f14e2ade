"""Who is who among several workers (tf.distribute's multi-worker strategies), and deciding
together."""

from __future__ import annotations

import functools

import tensorflow as tf


def worker_resolver(strategy: tf.distribute.Strategy):
    """The strategy's cluster resolver when this process is one worker of several, else None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver if resolver is not None and resolver.task_type else None


def chief(strategy: tf.distribute.Strategy) -> tuple[bool, int]:
    """(whether this process is the chief, its task index): the chief writes output_dir, every
    other worker output_dir/.workers/worker-N."""
    resolver = worker_resolver(strategy)
    if resolver is None:
        return True, 0
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return resolver.task_type == "chief", resolver.task_id or 0
    return resolver.task_type == "worker" and resolver.task_id == 0, resolver.task_id or 0


def common_step(strategy: tf.distribute.Strategy, newest: int, can_restore) -> int:
    """The newest checkpoint step every worker can restore (0: none), from each worker's newest
    readable step and whether it can restore a given one: a kill can come between two workers'
    saves, and workers resumed at different steps would wait on each other's collectives."""
    if worker_resolver(strategy) is None:
        return newest
    gather = _compiled(strategy)[0]
    step = int(gather(tf.constant(newest, tf.int64)).numpy().min())
    # Every worker must hold that step (one ahead may have deleted an old one): else none (0).
    held = step == 0 or can_restore(step)
    return step if all(gather(tf.constant(int(held), tf.int64)).numpy()) else 0


def on_any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether `flag` holds on any worker. Each worker reads its own files, and a kill can come
    between two workers' writes: deciding together keeps every worker in the same collectives."""
    if worker_resolver(strategy) is None:  # one worker: nobody to agree with
        return flag
    any_worker = _compiled(strategy)[1]
    return bool(any_worker(tf.constant(1.0 if flag else 0.0)).numpy() > 0.0)


@functools.cache
def _compiled(strategy: tf.distribute.Strategy):
    """The strategy's collectives for deciding together, compiled once: a tf.function made anew
    at every call is traced anew (and TensorFlow warns of it)."""

    @tf.function
    def gather(value):
        return strategy.gather(strategy.run(lambda: tf.reshape(tf.identity(value), [1])), axis=0)

    @tf.function
    def any_worker(value):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(value)), axis=None)

    return gather, any_worker
