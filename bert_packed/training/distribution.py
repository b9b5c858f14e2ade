"""Who is who among several workers (tf.distribute's multi-worker strategies), deciding together,
and leaving together."""

from __future__ import annotations

import functools
import logging
import socket
import time

import tensorflow as tf

# The tasks that train together (and that TensorFlow's coordination service coordinates), the
# chief first: a TFJob's evaluator or parameter servers do not.
TRAINING_JOBS = ("chief", "worker")
# How long the chief waits for the other workers' processes to end before it leaves anyway: they
# have only their last writes and their summary line to do.
LEAVING_SECONDS = 60.0


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


def leave_together(strategy: tf.distribute.Strategy) -> None:
    """Returns at once on every worker but the chief, and on the chief once every other worker's
    process has ended (after LEAVING_SECONDS at most, with a warning): the chief leaves last.

    Call it when the run is over on every worker (its last collective done), before the process
    ends; one worker alone returns at once.
    """
    # TensorFlow's coordination service lives in the chief's process, and every other worker's
    # agent heartbeats to it until that worker's process ends: a worker that outlives the chief by
    # a heartbeat ends on "E0000 ... StartAbort UNAVAILABLE: Failed to send RPC to coordination
    # service". TensorFlow 2.21 has a shutdown barrier for this (shutdown_barrier_timeout_in_ms of
    # the coordination service's config), but only the agent's Shutdown() enters it, and Python
    # never calls that: at exit the server is released, not shut down ("Servers don't support
    # clean shutdown"), and a reset context does not reach it either. A barrier that every worker
    # passes (a collective, or the service's own WaitAtBarrier) still lets the chief exit while
    # the others do their last writes. So the chief waits until each other worker's server port,
    # open until its process ends, refuses a connection.
    resolver = worker_resolver(strategy)
    if resolver is None or not chief(strategy)[0]:
        return
    spec = resolver.cluster_spec()
    others = [spec.task_address(job, index) for job, index in _training_tasks(spec)
              if (job, index) != (resolver.task_type, resolver.task_id)]
    deadline = time.monotonic() + LEAVING_SECONDS
    while others and time.monotonic() < deadline:
        time.sleep(0.2)
        others = [address for address in others if _listening(address)]
    if others:
        logging.warning("%s still running %.0f s after the run ended; the chief leaves without waiting for them "
                        "(their last line may be TensorFlow's about the coordination service)", ", ".join(others),
                        LEAVING_SECONDS)


def _listening(address: str) -> bool:
    """Whether a server accepts connections at `address` (host:port, or [IPv6]:port)."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except OSError:  # refused (its process ended), unreachable or unknown: nobody to wait for
        return False
    return True


def _training_tasks(spec: tf.train.ClusterSpec) -> list[tuple[str, int]]:
    """The (job, index) of every task of `spec` that trains, the chief first: the order of ids
    TensorFlow gives them (a Slurm task's SLURM_PROCID is its id)."""
    return [(job, index) for job in TRAINING_JOBS if job in spec.jobs for index in spec.task_indices(job)]
