"""The tf.data input pipeline: TFRecord files -> batches of packed feature dicts.

Every mode yields the packed layout (bert_packed.features, docs/data_formats.md), so the model
has one code path: an unpacked record becomes a pack holding one sequence (sequence index 1
where its input_mask is 1, positions 0..n-1, its [CLS] at offset 0). The converters below build
the packed record layout; each mode renames it for the model once, at its end
(features.model_features: input_mask -> sequence_ids, masked_lm_weights -> prediction_sequence_ids).

Modes:
  packed         packed records (pack_pretraining_data output), [B, L] rows of several sequences.
  padded         unpacked records, each padded to L: the baseline.
  bucketed       unpacked records grouped by length into batches trimmed to a bucket boundary:
                 the variable-shape alternative to packing (fewer padded slots, several shapes).
  packed_online  unpacked records packed as they are read (bert_packed.packing.stream), guided by
                 the plan of the data's histogram: the rows packed records give, without a
                 packed copy of the data.
  packs_as_rows  packed records, each pack's sequences in rows of their own ([B * S, L], a row
                 with no sequence where a pack has fewer than S): a micro-batch holds exactly
                 what its packs hold, unpacked. What tells packing itself apart from what an
                 update holds (docs/experiments.md).
Fine-tuning's rows are made in memory from a task's files (bert_packed.finetuning); rows_dataset
batches them, packed or one example a row, epoch after epoch.

Feature shapes (B = batch, L = max_seq_length, P' = predictions per row, S = sequences per row):
  input_ids, sequence_ids, segment_ids, positions [B, L]; masked_lm_positions, masked_lm_ids,
  prediction_sequence_ids [B, P']; next_sentence_positions, next_sentence_labels,
  next_sentence_weights [B, S]. All int32. In packed data P' = P + S; in unpacked data P' = P and
  S = 1. sequence_ids and prediction_sequence_ids are the records' input_mask and
  masked_lm_weights: sequence indices (1..S, 0 for none), not a 0/1 mask and float weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import numpy as np
import tensorflow as tf

from bert_packed.errors import InternalError, SettingsError, TrainingError
from bert_packed.features import INPUT_MODES, PACKED_RECORD_MODES, Shapes, float_features, model_features, tf_feature_spec
from bert_packed.finetuning.encode import RepackedRows
from bert_packed.inputs.file_identity import check_unchanged
from bert_packed.packing.stream import StreamSettings, packed_batches
from bert_packed.records import read_packed, read_unpacked
from bert_packed.storage.files import storage_error
from bert_packed.training.rows_dataset import rows_dataset


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """How to read a dataset.

    Attributes:
      files: the TFRecord files (sorted).
      shapes: L, P and S of the records (S = 1 for unpacked files).
      mode: "packed" (packed files), "padded" or "bucketed" (unpacked files); see the module doc.
      batch_size: rows per batch (packs when packed).
      is_training: shuffle, repeat forever and drop the last partial batch.
      seed: seeds file order and the shuffle buffer.
      shuffle_buffer: records in the shuffle buffer.
      deterministic: the same seed gives the same batches, run after run.
      bucket_boundaries: with "bucketed", the lengths a batch is trimmed to (the last is L).
      cycle_length: files read in parallel.
      skip_steps: micro-steps already trained (a resumed run's position): every input pipeline
        passes over the batches it fed them, before parsing (cheap).
      max_batches: with is_training False, stop after this many batches (None: all).
      vocab_size: when given, a token id at or above it stops the pipeline with an error (on a GPU
        the embedding lookup would silently read zeros).
      type_vocab_size: when given, the same for segment ids.
      strategies: with "packed_online", the strategies of the plan the packer fills.
      online_packing_window: with "packed_online", sequences the packer may hold at once.
      identity: when given, each file's FileIdentity as the run started: checked before each
        evaluation and, packed on the fly, before each file is read; a reading error is traced to a
        changed file first.
      rows: rows held in memory, read instead of records (rows_dataset: a fine-tuning set made
        from `files`, packed or not as `mode` says).
    """

    files: tuple[str, ...]
    shapes: Shapes
    mode: str = "packed"
    batch_size: int = 8
    is_training: bool = True
    seed: int = 12345
    shuffle_buffer: int = 10_000
    deterministic: bool = False
    bucket_boundaries: tuple[int, ...] = ()
    cycle_length: int = 4
    skip_steps: int = 0
    max_batches: int | None = None
    vocab_size: int | None = None
    type_vocab_size: int | None = None
    strategies: tuple = ()
    online_packing_window: int | None = None
    identity: tuple = ()
    rows: dict | RepackedRows | None = dataclasses.field(default=None, repr=False, compare=False)


WATCHED_SINCE = "the run started"


def make_dataset(config: PipelineConfig, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The dataset of batches of packed feature dicts.

    Args:
      config: see PipelineConfig.
      input_context: from tf.distribute (distribute_datasets_from_function); batch_size is then
        the global batch. For training each input pipeline reads its own share of the files; for
        evaluation its share of the records, so that one eval file serves any number of workers,
        and every pipeline yields the same number of batches (a padding batch that counts
        nothing evens them out), so that together they evaluate every record exactly once.

    Returns:
      A tf.data.Dataset of {feature: int32 tensor}; see the module docstring for shapes.
    """
    if config.mode not in INPUT_MODES:
        raise SettingsError(f"unknown input mode {config.mode!r}; expected one of {', '.join(INPUT_MODES)}")
    if not config.files:
        raise SettingsError("no input files")
    if not config.is_training:  # read once, from here: checked now
        check_unchanged(config.identity, WATCHED_SINCE)
    if config.rows is not None:
        return _finished(rows_dataset(config.rows, config.batch_size, config.seed, config.skip_steps,
                                      config.is_training, input_context), config, input_context)
    shapes = config.shapes
    batch_size = config.batch_size
    skip = config.skip_steps
    files = tf.data.Dataset.from_tensor_slices(list(config.files))
    if input_context is not None:
        # Each micro-step takes one batch from this pipeline for every replica it feeds.
        skip = config.skip_steps * input_context.num_replicas_in_sync // input_context.num_input_pipelines
        # batch_size is global: each replica gets its share (one host may feed several replicas).
        batch_size = input_context.get_per_replica_batch_size(config.batch_size)
        if config.mode == "packed_online":
            return _packed_online(config, batch_size, skip, input_context)
        if input_context.num_input_pipelines > 1 and not config.is_training:
            return _evaluation_share(config, input_context, batch_size)
        if input_context.num_input_pipelines > 1:
            if len(config.files) < input_context.num_input_pipelines:
                raise SettingsError(too_few_files(len(config.files), input_context.num_input_pipelines))
            files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if config.mode == "packed_online":
        return _packed_online(config, batch_size, skip, None)
    if config.is_training:
        files = files.shuffle(len(config.files), seed=config.seed, reshuffle_each_iteration=True).repeat()
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=config.cycle_length,
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic or None)
    if config.is_training:
        records = records.shuffle(config.shuffle_buffer, seed=config.seed, reshuffle_each_iteration=True)

    if config.mode == "bucketed":
        dataset = _bucketed(records, shapes, batch_size, config, skip)
    else:
        batches = records.batch(batch_size, drop_remainder=config.is_training).skip(skip)
        dataset = _parsed(batches, config)
    return _finished(dataset, config, input_context)


def _parsed(batches: tf.data.Dataset, config: PipelineConfig) -> tf.data.Dataset:
    """Batches of serialized records -> batches of packed feature dicts."""
    packed = config.mode in PACKED_RECORD_MODES
    spec = tf_feature_spec(config.shapes.record_lengths(packed), float_features(packed))
    convert = {"packed": _cast, "packs_as_rows": _packs_as_rows}.get(config.mode, _as_single_packs)

    @tf.autograph.experimental.do_not_convert  # no control flow on tensors: traced as written, at once
    def parse(serialized):
        return _checked_ids(model_features(convert(tf.io.parse_example(serialized, spec))), config)

    return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic or None)


def _checked_ids(features: dict, config: PipelineConfig) -> dict:
    """The features, after checking every token and segment id is inside the model's vocabularies."""
    limits = [(name, "token id", "vocab_size", config.vocab_size) for name in ("input_ids", "masked_lm_ids")]
    limits.append(("segment_ids", "segment id", "type_vocab_size", config.type_vocab_size))
    checks = [tf.debugging.assert_less(features[name], limit, message=f"{name} holds a {what} at or above "
                                                                      f"{size}={limit} of the BERT config")
              for name, what, size, limit in limits if limit is not None]
    if not checks:
        return features
    with tf.control_dependencies(checks):
        return {name: tf.identity(value) for name, value in features.items()}


def _finished(dataset: tf.data.Dataset, config: PipelineConfig,
              input_context: tf.distribute.InputContext | None) -> tf.data.Dataset:
    if config.max_batches is not None and not config.is_training:
        # max_batches counts whole batches; a pipeline yields one share a replica it feeds.
        dataset = dataset.take(config.max_batches * _replicas_fed(input_context))
    options = tf.data.Options()
    options.deterministic = config.deterministic
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _replicas_fed(input_context: tf.distribute.InputContext | None) -> int:
    """The replicas an input pipeline feeds: a distributed step takes a share from it for each."""
    if input_context is None:
        return 1
    return input_context.num_replicas_in_sync // input_context.num_input_pipelines


@functools.lru_cache(maxsize=8)
def _count_records(files: tuple[str, ...]) -> int:
    """Records in the files; counted once per set of files (the eval set is shared at every evaluation)."""
    records = tf.data.TFRecordDataset(list(files))
    return int(records.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))


def _packed_online(config: PipelineConfig, batch_size: int, skip: int,
                   input_context: tf.distribute.InputContext | None) -> tf.data.Dataset:
    """Unpacked records packed as they are read, in batches of [batch_size, L] (static shapes:
    XLA compiles once). Training shares files among input pipelines as the other modes do; an
    evaluation packs the whole set in every pipeline and each takes every n-th batch, padded with
    empty batches to as many as every other's, a whole number for each replica it feeds (a
    distributed step leaves out a share of static shape it cannot fill)."""
    pipelines = input_context.num_input_pipelines if input_context is not None else 1
    index = input_context.input_pipeline_id if input_context is not None else 0
    files = list(config.files)
    if config.is_training and pipelines > 1:
        if len(files) < pipelines:
            raise SettingsError(too_few_files(len(files), pipelines))
        files = files[index::pipelines]
    if not config.strategies or config.online_packing_window is None:
        raise InternalError("packed_online needs the strategies of a plan and an online packing window")
    settings = StreamSettings(config.shapes, config.strategies, config.online_packing_window, batch_size, config.seed,
                              config.is_training, skip_batches=skip)
    signature = {name: tf.TensorSpec([batch_size, length], tf.int32)
                 for name, length in config.shapes.model_lengths().items()}

    by_path = {entry.path: entry for entry in config.identity}

    def opened(path):
        if path in by_path:
            check_unchanged([by_path[path]], WATCHED_SINCE)

    def batches():
        # The stream's packs are the offline packer's, under the record keys: renamed for the model here.
        stream = map(model_features, packed_batches(files, settings, opened if config.is_training else None))
        if config.is_training:
            yield from stream
            return
        taken = total = 0
        for total, batch in enumerate(stream, 1):
            if (total - 1) % pipelines == index:
                taken += 1
                yield batch
        replicas = _replicas_fed(input_context)
        for _ in range(-(-total // pipelines // replicas) * replicas - taken):
            yield {name: np.zeros(spec.shape, np.int32) for name, spec in signature.items()}

    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    dataset = dataset.map(tf.autograph.experimental.do_not_convert(lambda features: _checked_ids(features, config)))
    return _finished(dataset, config, input_context)


def _evaluation_share(config: PipelineConfig, input_context: tf.distribute.InputContext,
                      batch_size: int) -> tf.data.Dataset:
    """This input pipeline's records of the eval set (every num-th from the id-th), in batches; as
    many batches as every other pipeline's, the last one padded out with a batch that counts
    nothing (no predictions, no sequences)."""
    num, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    records = tf.data.TFRecordDataset(list(config.files))
    total = _count_records(config.files)
    own, most = len(range(index, total, num)), -(-total // num)
    dataset = _parsed(records.shard(num, index).batch(batch_size), config)
    padding = -(-most // batch_size) - -(-own // batch_size)
    if padding:
        # The parsed layout of either mode (unpacked records: packs of one sequence, S = 1).
        empty = {name: tf.zeros([1, length], tf.int32) for name, length in config.shapes.model_lengths().items()}
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(empty).repeat(padding))
    return _finished(dataset, config, input_context)


def _cast(features: dict) -> dict:
    return {name: tf.cast(value, tf.int32) for name, value in features.items()}


def _packs_as_rows(features: dict) -> dict:
    """Packed records' features [B, ...] -> each pack's sequences in rows of their own, [B * S, ...]
    (the packed record layout of one sequence a row; a row with no sequence is all zeros and
    counts nothing).

    A pack's sequence k (1-based) is where input_mask == k; it starts at
    next_sentence_positions[k - 1]. Its row takes its tokens from there, and its predictions
    (where masked_lm_weights == k) with positions relative to that start.
    """
    packs = _cast(features)
    batch, length = tf.shape(packs["input_ids"])[0], tf.shape(packs["input_ids"])[1]
    depth = tf.shape(packs["next_sentence_weights"])[1]
    sequence = tf.range(1, depth + 1)[None, :, None]                                       # [1, S, 1]
    start = packs["next_sentence_positions"][:, :, None]                                   # [B, S, 1]
    size = tf.reduce_sum(tf.cast(packs["input_mask"][:, None, :] == sequence, tf.int32), -1, keepdims=True)
    offset = tf.range(length)[None, None, :]                                                # [1, 1, L]
    inside = offset < size                                                                  # [B, S, L]
    where = tf.minimum(start + offset, length - 1)

    def take(name):  # [B, L] -> [B, S, L]: each sequence's values from its start
        return tf.where(inside, tf.gather(packs[name], where, batch_dims=1), 0)

    mine = packs["masked_lm_weights"][:, None, :] == sequence                              # [B, S, P']
    rows = {
        "input_ids": take("input_ids"), "segment_ids": take("segment_ids"),
        "input_mask": tf.cast(inside, tf.int32), "positions": tf.where(inside, offset, 0),
        "masked_lm_positions": tf.where(mine, packs["masked_lm_positions"][:, None, :] - start, 0),
        "masked_lm_ids": tf.where(mine, packs["masked_lm_ids"][:, None, :], 0),
        "masked_lm_weights": tf.cast(mine, tf.int32),
        "next_sentence_positions": tf.zeros([batch, depth, 1], tf.int32),
        "next_sentence_labels": packs["next_sentence_labels"][:, :, None],
        "next_sentence_weights": packs["next_sentence_weights"][:, :, None],
    }
    return {name: tf.reshape(value, [batch * depth, -1]) for name, value in rows.items()}


def _as_single_packs(features: dict) -> dict:
    """Unpacked records' features [B, ...] -> the packed record layout with one sequence per row."""
    input_mask = tf.cast(features["input_mask"], tf.int32)  # 1 = sequence 1, 0 = padding
    batch = tf.shape(input_mask)[0]
    ones = tf.ones([batch, 1], tf.int32)
    return {
        "input_ids": tf.cast(features["input_ids"], tf.int32),
        "input_mask": input_mask,
        "segment_ids": tf.cast(features["segment_ids"], tf.int32),
        "positions": tf.range(tf.shape(input_mask)[1], dtype=tf.int32)[None, :] * input_mask,
        "masked_lm_positions": tf.cast(features["masked_lm_positions"], tf.int32),
        "masked_lm_ids": tf.cast(features["masked_lm_ids"], tf.int32),
        "masked_lm_weights": tf.cast(features["masked_lm_weights"] > 0, tf.int32),
        "next_sentence_positions": tf.zeros([batch, 1], tf.int32),
        "next_sentence_labels": tf.cast(features["next_sentence_labels"], tf.int32),
        "next_sentence_weights": ones,
    }


def _bucketed(records, shapes: Shapes, batch_size: int, config: PipelineConfig, skip: int):
    """Unpacked records in batches of similar length, trimmed to their bucket's boundary."""
    boundaries = sorted(set(config.bucket_boundaries) | {shapes.max_seq_length})  # in [1, L]: training.data checks
    spec = tf_feature_spec(shapes.record_lengths(False), float_features(False))
    examples = records.map(lambda serialized: tf.io.parse_single_example(serialized, spec),
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic or None)
    # bucket_by_sequence_length puts length n in the first bucket whose upper bound exceeds it.
    dataset = examples.bucket_by_sequence_length(
        lambda example: tf.cast(tf.reduce_sum(example["input_mask"]), tf.int32),
        bucket_boundaries=[b + 1 for b in boundaries[:-1]],
        bucket_batch_sizes=[batch_size] * len(boundaries),
        drop_remainder=config.is_training).skip(skip)

    @tf.autograph.experimental.do_not_convert  # as parse's, in _parsed
    def trim(features):
        batch = _checked_ids(_as_single_packs(features), config)  # the record layout until renamed below
        longest = tf.reduce_max(tf.reduce_sum(batch["input_mask"], axis=1))
        width = tf.gather(tf.constant(boundaries), tf.searchsorted(tf.constant(boundaries), [longest])[0])
        for name in ("input_ids", "input_mask", "segment_ids", "positions"):
            batch[name] = batch[name][:, :width]
        return model_features(batch)

    return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic or None)


@contextlib.contextmanager
def reading_errors_named(config: PipelineConfig):
    """TensorFlow's reading errors name no file: in this block, one that the input raised (its
    iterator, not the model: a shape error or a missing kernel there is a bug, and goes on as it
    is) is replaced by an error naming the changed file or the bad record (or, when the files read
    cleanly, one line with TensorFlow's reason), and what the storage refused or failed is a
    StorageError.

    Raises:
      DataChangedError / CorruptRecordError / RecordError / TrainingError / StorageError: one line.
    """
    try:
        yield
    except tf.errors.OpError as e:
        if not isinstance(e, tf.errors.DataLossError) and not any(op in str(e) for op in ("IteratorGetNext",
                                                                                          "Iterator::")):
            raise
        check_unchanged(config.identity, WATCHED_SINCE)  # a file changed: say that, not what its reading met
        if not isinstance(e, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
            converted = storage_error(e, None)
            if converted is None:  # not the storage's (out of memory, say): as it is
                raise
            raise converted from e
        diagnose_input_error(config)
        raise TrainingError(f"reading {', '.join(config.files[:3])}...: {tensorflow_reason(e)}") from None


def tensorflow_reason(error: Exception) -> str:
    """The line of a TensorFlow error that says what went wrong (an assertion's own message first)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "assertion failed: [" in line:
            return line.split("assertion failed: [", 1)[1].split("]", 1)[0]
    informative = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node"))]
    return (informative or lines or [type(error).__name__])[0]


def diagnose_input_error(config: PipelineConfig) -> None:
    """After tf.data failed on the files (corrupt record, wrong feature lengths), finds the
    first bad record and raises an error naming its file and index; returns if none is found.

    Raises:
      CorruptRecordError / RecordError: naming file, record and what was expected.
    """
    packed = config.mode in PACKED_RECORD_MODES
    read = read_packed if packed else read_unpacked
    shapes = config.shapes if packed else config.shapes.unpacked()
    for path in config.files:
        for _ in read(path, shapes):
            pass


def too_few_files(num_files: int, pipelines: int) -> str:
    """What to do when each input pipeline (one a worker) cannot read files of its own."""
    return (f"{num_files} training files cannot be shared among {pipelines} input pipelines (one a worker): each "
            f"reads files of its own. Pack into at least {pipelines} files (pack_pretraining_data "
            f"--num_shards={pipelines}), or give create_pretraining_data at least {pipelines} text files")
