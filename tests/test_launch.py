"""Launched by a scheduler: the workers leave together."""

import socket
import threading
import time
import types

import tensorflow as tf

from bert_packed.training import distribution


def test_the_chief_leaves_once_the_other_workers_processes_have_ended(tmp_path):
    """The chief returns once every other worker's server port refuses connections; any other
    worker returns at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    other = f"127.0.0.1:{listener.getsockname()[1]}"
    cluster = {"worker": ["127.0.0.1:1", other]}

    def strategy(index):
        return types.SimpleNamespace(cluster_resolver=tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="worker", task_id=index))

    start = time.monotonic()
    distribution.leave_together(strategy(1))
    assert time.monotonic() - start < 0.5
    threading.Timer(1.5, listener.close).start()  # the other worker's process ends
    distribution.leave_together(strategy(0))
    assert 1.5 <= time.monotonic() - start < 3.0
