"""Sequences held in memory (a fine-tuning task's rows, packed once or packed again each epoch)
as a tf.data stream of batches, shuffled by seed and resumable at any batch.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bert_packed.errors import SettingsError
from bert_packed.finetuning.encode import RepackedRows


def rows_dataset(rows: dict[str, np.ndarray] | RepackedRows, batch_size: int, seed: int, first_batch: int = 0,
                 is_training: bool = True, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """Batches of rows held in memory (a fine-tuning set, bert_packed.finetuning.encode.make_rows).

    In training the rows are read epoch after epoch, each epoch in an order that is a function of
    (seed, epoch) alone, and batch b holds positions [b * batch_size, (b + 1) * batch_size) of
    that endless stream (a batch may span two epochs; no row is left out of an epoch). So batch b
    is the same whenever it is read: a run resumed at batch b reads what the uninterrupted run read
    from b on. In evaluation every row is read once, in order, and the last batch is filled with
    empty rows (no sequence: they count nothing), so that every replica gets as many batches.

    For 5 rows in batches of 2, where the seed orders epoch 0 as [3 1 2 0 4] and epoch 1 as
    [4 1 3 2 0]: batches [3 1] [2 0] [4 4] [1 3] [2 0] ...; first_batch=2 starts at [4 4].

    Rows packed anew each epoch (RepackedRows, training only) are read the same way, each epoch's
    rows made when the stream reaches it: the same epoch's rows whenever it is read.

    Args:
      rows: {feature: array [num_rows, ...]}, an empty row all zeros; or RepackedRows.
      batch_size: rows a batch, all replicas together.
      seed: the epochs' orders.
      first_batch: the first batch to read (a resumed run's micro-step).
      is_training: shuffle and repeat (else every row once, in order).
      input_context: under a tf.distribute strategy: this input pipeline yields its replicas'
        shares of each batch, one replica's after another (replica k of batch b is the stream's
        (b * replicas + k)-th share).

    Returns:
      A dataset of {feature: tensor [batch_size / replicas, ...]}.
    """
    replicas, pipelines, pipeline = ((input_context.num_replicas_in_sync, input_context.num_input_pipelines,
                                      input_context.input_pipeline_id) if input_context else (1, 1, 0))
    if batch_size % replicas:
        raise SettingsError(f"a batch of {batch_size} rows does not split over {replicas} replicas")
    if isinstance(rows, RepackedRows):
        rows_of_epochs = _repacked_epochs(rows, seed, first_batch * batch_size)
        return _shares(rows_of_epochs.batch(batch_size // replicas), replicas, pipelines, pipeline)
    num_rows = len(next(iter(rows.values())))
    if is_training:
        start = first_batch * batch_size
        first_epoch = start // num_rows

        def epoch_order(epoch):
            return tf.data.Dataset.from_tensor_slices(tf.random.experimental.stateless_shuffle(
                tf.range(num_rows, dtype=tf.int64), seed=tf.stack([tf.cast(seed, tf.int64), epoch])))

        stream = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch_order).skip(start - first_epoch * num_rows)
    else:
        padded = -(-num_rows // batch_size) * batch_size
        rows = {name: np.concatenate([value, np.zeros((padded - num_rows, *value.shape[1:]), value.dtype)])
                for name, value in rows.items()}
        stream = tf.data.Dataset.range(padded)
    tensors = {name: tf.constant(value) for name, value in rows.items()}
    shares = _shares(stream.batch(batch_size // replicas), replicas, pipelines, pipeline)
    return shares.map(lambda index: {k: tf.gather(v, index) for k, v in tensors.items()})


def _shares(batches: tf.data.Dataset, replicas: int, pipelines: int, pipeline: int) -> tf.data.Dataset:
    """This input pipeline's replicas' shares of a stream of shares (rows_dataset)."""
    if pipelines == 1:
        return batches
    per_pipeline = replicas // pipelines
    return batches.enumerate().filter(lambda index, _: index % replicas // per_pipeline == pipeline).map(
        lambda _, share: share)


def _repacked_epochs(rows: RepackedRows, seed: int, start: int) -> tf.data.Dataset:
    """The rows of a set packed anew each epoch, epoch after epoch, each epoch's rows in an order
    of (seed, epoch), from row `start` of that stream on (rows_dataset)."""
    layout = rows.layout
    names = sorted(layout)

    def epoch_rows(epoch):
        made = rows.epoch(int(epoch))
        return [made[name] for name in names]

    def one_epoch(epoch):
        values = tf.py_function(epoch_rows, [epoch], [tf.as_dtype(layout[name][1]) for name in names])
        order = tf.random.experimental.stateless_shuffle(tf.range(rows.num_rows, dtype=tf.int64),
                                                         seed=tf.stack([tf.cast(seed, tf.int64), epoch]))
        shaped = {name: tf.gather(tf.ensure_shape(value, [rows.num_rows, layout[name][0]]), order)
                  for name, value in zip(names, values)}
        return tf.data.Dataset.from_tensor_slices(shaped)

    first_epoch = start // rows.num_rows
    return tf.data.Dataset.range(first_epoch, 2**62).flat_map(one_epoch).skip(start - first_epoch * rows.num_rows)
