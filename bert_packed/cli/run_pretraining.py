"""Pre-train BERT with the MLPerf recipe on packed (or padded, or bucketed) data.

    python run_pretraining.py --flagfile=configs/bert_large_mlperf_packed.cfg

Flag names follow the MLPerf reference where one exists. train_batch_size counts rows (packs
when packed); logs count sequences too. Flags that disagree with the data's metadata.json
(sequence length, predictions, depth) or with each other stop the run before any work.
"""

from __future__ import annotations

import json
import logging

from absl import flags

from bert_packed.cli.common import expand_globs, run
from bert_packed.dataset_info import DatasetInfo, dataset_info_of_files
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes

FLAGS = flags.FLAGS
flags.DEFINE_string("bert_config_file", None, "google-research bert_config.json.")
flags.DEFINE_string("input_files", None, "Comma-separated globs of training TFRecords.")
flags.DEFINE_string("eval_files", None, "Comma-separated globs of evaluation TFRecords (packed or unpacked).")
flags.DEFINE_string("output_dir", None, "Logs, checkpoints, TensorBoard; a run restarted here resumes.")
flags.DEFINE_string("init_checkpoint", None, "google-research/MLPerf TF1 checkpoint to start from.")
flags.DEFINE_integer("max_seq_length", 512, "L of the data.")
flags.DEFINE_integer("max_predictions_per_seq", 76, "P of the data (packs hold P + S).")
flags.DEFINE_integer("max_sequences_per_pack", 3, "S of packed training data (ignored for padded/bucketed).")
flags.DEFINE_enum("input_mode", "packed", ["packed", "padded", "bucketed"], "How the training data is read.")
flags.DEFINE_list("bucket_boundaries", [], "Lengths batches are trimmed to in bucketed mode.")
flags.DEFINE_integer("train_batch_size", 8, "Rows per micro-batch, all replicas (packs when packed).")
flags.DEFINE_integer("eval_batch_size", 8, "Rows per eval batch.")
flags.DEFINE_float("learning_rate", 4.25e-4, "Peak learning rate.")
flags.DEFINE_integer("num_train_steps", 100, "Updates.")
flags.DEFINE_integer("num_warmup_steps", 0, "Linear warmup updates.")
flags.DEFINE_integer("start_warmup_step", 0, "Warmup origin (negative: start partway through warmup).")
flags.DEFINE_integer("steps_per_update", 1, "Micro-batches accumulated into one update.")
flags.DEFINE_enum("optimizer", "lamb", ["lamb", "adamw"], "LAMB (MLPerf) or AdamW (original BERT).")
flags.DEFINE_float("lamb_beta_1", 0.9, "beta_1 (before any packing adjustment).")
flags.DEFINE_float("lamb_beta_2", 0.999, "beta_2 (before any packing adjustment).")
flags.DEFINE_float("lamb_weight_decay_rate", 0.01, "Weight decay inside the update.")
flags.DEFINE_float("epsilon", 1e-6, "Optimizer epsilon.")
flags.DEFINE_bool("adjust_betas_for_packing", False, "Raise the betas to the power of the packing factor.")
flags.DEFINE_enum("loss_averaging", "token", ["token", "sequence"], "MLM loss basis.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every this many updates (and at the end).")
flags.DEFINE_integer("seed", 12345, "Seed for initialisation, data order and dropout.")
flags.DEFINE_bool("deterministic", False, "Same flags, same results (op determinism, fixed data order).")
flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16", "fp16"], "fp16 uses dynamic loss scaling.")
flags.DEFINE_bool("xla", False, "Compile the forward and backward pass with XLA.")
flags.DEFINE_enum("distribution_strategy", "default", ["default", "mirrored", "multi_worker_mirrored", "tpu"],
                  "tf.distribute strategy (multi_worker_mirrored reads TF_CONFIG).")
flags.DEFINE_string("tpu", None, "TPU name or address for --distribution_strategy=tpu.")
flags.DEFINE_float("target_mlm_accuracy", 0.720, "Stop when evaluation reaches this masked-LM accuracy.")
flags.DEFINE_integer("eval_every_samples", -1, "Evaluate every this many sequences; -1: the MLPerf cadence; "
                                               "0: once at the end.")
flags.DEFINE_integer("log_every_steps", 10, "Progress line every this many updates.")
flags.mark_flags_as_required(["bert_config_file", "input_files", "output_dir"])

PROGRAM = "run_pretraining"


def mlperf_eval_every_samples(sequences_per_update: float) -> int:
    """floor(0.05 * (230.23 * global batch + 3,000,000) / 25,000) * 25,000 (docs/training.md).

    >>> mlperf_eval_every_samples(448)
    150000
    """
    return int(0.05 * (230.23 * sequences_per_update + 3_000_000) // 25_000) * 25_000


def data_description(files: list[str], what: str, expect_packed: bool | None) -> DatasetInfo:
    """Checks the flags against the data's metadata.json; returns what the data is.

    Args:
      files: the data files (metadata.json sits beside the first).
      what: the flag that named them, for messages.
      expect_packed: True or False for training data (--input_mode decides); None for eval data,
        which may be either.

    Raises:
      SettingsError: naming the flag and the value the data has.
    """
    info = dataset_info_of_files(files)
    if info is None:
        logging.warning("%s: no metadata.json beside the files; cannot check them against the flags", what)
        packed = bool(expect_packed)
        shapes = Shapes(FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                        FLAGS.max_sequences_per_pack if packed else 1)
        return DatasetInfo(packed, shapes, num_sequences=0, num_records=0, files=tuple(files))
    if expect_packed is False and info.packed:
        raise SettingsError(f"{what}: packed data (metadata.json), but --input_mode={FLAGS.input_mode} reads "
                            f"unpacked records; use --input_mode=packed")
    if expect_packed and not info.packed:
        raise SettingsError(f"{what}: unpacked data, but --input_mode=packed; pack it with "
                            f"scripts/pack_pretraining_data.py or use --input_mode=padded")
    depth = info.shapes.max_sequences_per_pack
    if expect_packed and depth != FLAGS.max_sequences_per_pack:
        raise SettingsError(f"{what}: packed with max_sequences_per_pack={depth}, "
                            f"but --max_sequences_per_pack={FLAGS.max_sequences_per_pack}")
    found = {"max_seq_length": info.shapes.max_seq_length,
             "max_predictions_per_seq": info.shapes.max_predictions_per_seq}
    for name, value in found.items():
        if value != getattr(FLAGS, name):
            raise SettingsError(f"{what}: the data has {name}={value}, but --{name}={getattr(FLAGS, name)}")
    return info


def make_strategy():
    import tensorflow as tf

    if FLAGS.distribution_strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    if FLAGS.distribution_strategy == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if FLAGS.distribution_strategy == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=FLAGS.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    return tf.distribute.get_strategy()


def build_config():
    """Flags -> TrainConfig, after every check that needs no model."""
    from bert_packed.model import BertConfig
    from bert_packed.training.config import EvalData, ModelConfig, OptimizerConfig, RunConfig, TrainConfig, TrainData

    if FLAGS.steps_per_update < 1 or FLAGS.train_batch_size < 1 or FLAGS.num_train_steps < 1:
        raise SettingsError("--steps_per_update, --train_batch_size and --num_train_steps must be >= 1")
    if FLAGS.num_warmup_steps > FLAGS.num_train_steps:
        raise SettingsError(f"--num_warmup_steps={FLAGS.num_warmup_steps} exceeds "
                            f"--num_train_steps={FLAGS.num_train_steps}")
    if FLAGS.distribution_strategy == "tpu" and not FLAGS.tpu:
        raise SettingsError("--distribution_strategy=tpu needs --tpu")
    packed = FLAGS.input_mode == "packed"
    if FLAGS.adjust_betas_for_packing and not packed:
        raise SettingsError(f"--adjust_betas_for_packing needs packed data, not --input_mode={FLAGS.input_mode}")
    if FLAGS.bucket_boundaries and FLAGS.input_mode != "bucketed":
        raise SettingsError("--bucket_boundaries is for --input_mode=bucketed")
    bert_config = BertConfig.from_json_file(FLAGS.bert_config_file)
    if FLAGS.max_seq_length > bert_config.max_position_embeddings:
        raise SettingsError(f"--max_seq_length={FLAGS.max_seq_length} exceeds max_position_embeddings="
                            f"{bert_config.max_position_embeddings} of {FLAGS.bert_config_file}")
    input_files = expand_globs(FLAGS.input_files, "--input_files")
    train_info = data_description(input_files, "--input_files", packed)
    packing_factor = train_info.packing_factor
    eval_data = EvalData(target_mlm_accuracy=FLAGS.target_mlm_accuracy)
    if FLAGS.eval_files:
        eval_files = expand_globs(FLAGS.eval_files, "--eval_files")
        eval_info = data_description(eval_files, "--eval_files", None)
        every = FLAGS.eval_every_samples
        if every < 0:
            every = mlperf_eval_every_samples(FLAGS.train_batch_size * FLAGS.steps_per_update * packing_factor)
        eval_data = EvalData(tuple(eval_files), eval_info.shapes, eval_info.packed, FLAGS.eval_batch_size, every,
                             FLAGS.target_mlm_accuracy)
    return TrainConfig(
        model=ModelConfig(bert_config, FLAGS.init_checkpoint, FLAGS.loss_averaging, FLAGS.precision, FLAGS.xla),
        train_data=TrainData(tuple(input_files), train_info.shapes, FLAGS.input_mode, packing_factor,
                             FLAGS.train_batch_size, FLAGS.steps_per_update,
                             tuple(int(b) for b in FLAGS.bucket_boundaries)),
        optimizer=OptimizerConfig(FLAGS.optimizer, FLAGS.learning_rate, FLAGS.num_train_steps, FLAGS.num_warmup_steps,
                                  FLAGS.start_warmup_step, FLAGS.lamb_beta_1, FLAGS.lamb_beta_2,
                                  FLAGS.lamb_weight_decay_rate, FLAGS.epsilon, FLAGS.adjust_betas_for_packing),
        run=RunConfig(FLAGS.output_dir, FLAGS.seed, FLAGS.deterministic, FLAGS.save_checkpoints_steps,
                      FLAGS.log_every_steps, FLAGS.flags_into_string()),
        eval_data=eval_data)


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    from bert_packed.training.trainer import Trainer

    metrics = Trainer(build_config(), make_strategy()).train()
    print(json.dumps(metrics))


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
