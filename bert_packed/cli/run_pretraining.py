"""Pre-train BERT with the MLPerf recipe on packed (or padded, or bucketed) data.

    python run_pretraining.py --flagfile=configs/bert_large_mlperf_packed.cfg

Every flag of the MLPerf reference's run_pretraining.py and optimization.py is accepted with the
reference's meaning; where our name differs, both spellings work (--input_file/--input_files,
--log_epsilon/--epsilon, --tpu_name/--tpu), and both with different values is an error. Steps
count as the reference counts them: micro-steps, steps_per_update of them to an update.
train_batch_size counts rows (packs when packed, unless --adjust_batch_for_packing); logs count
sequences too. Flags that disagree with the data's metadata.json or with each other stop the run
before any work.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

from absl import flags

from bert_packed.cli.common import command_flags_text, exit_with, expand_globs, import_tensorflow, run
from bert_packed.dataset_info import DatasetInfo, dataset_info_of_files
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes

FLAGS = flags.FLAGS
# The reference's flags (run_pretraining.py and optimization.py), with the reference's meaning.
flags.DEFINE_string("bert_config_file", None, "google-research bert_config.json.")
flags.DEFINE_string("input_file", None, "Comma-separated globs of training TFRecords (the reference's name of "
                                        "--input_files). With --do_eval alone: the eval set.")
flags.DEFINE_string("output_dir", None, "Logs, checkpoints, TensorBoard; a run restarted here resumes.")
flags.DEFINE_string("init_checkpoint", None, "google-research/MLPerf TF1 checkpoint to start from.")
flags.DEFINE_integer("max_seq_length", 512, "L of the data (reference default 128).")
flags.DEFINE_integer("max_predictions_per_seq", 76, "P of the data; packs hold P + S (reference default 20).")
flags.DEFINE_bool("do_train", True, "Train (reference default False: there both do_* are given).")
flags.DEFINE_bool("do_eval", False, "Evaluate: alone, once, the latest checkpoint of --output_dir or "
                                    "--init_checkpoint; with --do_train, during training, on --eval_files or else "
                                    "on --input_file.")
flags.DEFINE_integer("train_batch_size", 8, "Rows per micro-batch, all replicas: packs when packed, unpacked rows "
                                            "with --adjust_batch_for_packing (reference default 32).")
flags.DEFINE_integer("eval_batch_size", 8, "Rows per eval batch, all replicas.")
flags.DEFINE_enum("optimizer", "lamb", ["lamb", "adamw"], "LAMB (MLPerf) or AdamW (original BERT; the reference's "
                                                          "default).")
flags.DEFINE_float("learning_rate", 4.25e-4, "Peak learning rate (reference default 5e-5).")
flags.DEFINE_float("poly_power", 1.0, "Power of the polynomial learning-rate decay.")
flags.DEFINE_integer("num_train_steps", 100, "Micro-steps (reference default 100000); updates are "
                                             "num_train_steps // steps_per_update.")
flags.DEFINE_integer("num_warmup_steps", 0, "Linear warmup micro-steps (reference default 10000).")
flags.DEFINE_integer("start_warmup_step", 0, "Warmup origin in micro-steps (negative: start partway through).")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every this many micro-steps (and at the end), "
                                                     "rounded up to whole compiled loops.")
flags.DEFINE_integer("iterations_per_loop", 1, "Micro-steps in one compiled call, no host reads inside; logs, "
                                               "checkpoints and evaluations happen between calls (reference "
                                               "default 1000).")
flags.DEFINE_integer("max_eval_steps", None, "Evaluate at most this many batches (default: the whole eval set; "
                                             "reference default 100).")
flags.DEFINE_bool("use_tpu", False, "Run on a TPU (--tpu_name or --master names it).")
flags.DEFINE_string("tpu_name", None, "TPU name or grpc:// address (the reference's name of --tpu).")
flags.DEFINE_string("tpu_zone", None, "GCE zone of the TPU (default: detected).")
flags.DEFINE_string("gcp_project", None, "GCP project of the TPU (default: detected).")
flags.DEFINE_string("master", None, "TPU master address, used with --use_tpu when --tpu_name is not given.")
flags.DEFINE_integer("num_tpu_cores", 8, "TPU cores; checked against the TPU found when given.")
flags.DEFINE_integer("num_gpus", 0, "GPUs: more than 1 mirrors over that many (--distribution_strategy=mirrored); "
                                    "checked against the GPUs visible.")
flags.DEFINE_integer("steps_per_update", 1, "Micro-batches accumulated into one update.")
flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints kept.")
flags.DEFINE_float("lamb_weight_decay_rate", 0.01, "Weight decay inside the update.")
flags.DEFINE_float("lamb_beta_1", 0.9, "beta_1 (before any packing adjustment).")
flags.DEFINE_float("lamb_beta_2", 0.999, "beta_2 (before any packing adjustment).")
flags.DEFINE_float("log_epsilon", -6, "Optimizer epsilon is 10**log_epsilon (or give --epsilon).")
flags.DEFINE_bool("clip_by_global_norm_after_gradient_allreduce", False,
                  "Clip the gradient of the whole update (summed over replicas and micro-batches) to norm 1; "
                  "default, as the reference: clip each replica's gradient of each micro-batch, then average.")
# This project's flags.
flags.DEFINE_string("input_files", None, "Comma-separated globs of training TFRecords (= --input_file).")
flags.DEFINE_string("eval_files", None, "Comma-separated globs of evaluation TFRecords (packed or unpacked).")
flags.DEFINE_float("epsilon", 1e-6, "Optimizer epsilon (= 10**--log_epsilon).")
flags.DEFINE_string("tpu", None, "TPU name or address (= --tpu_name).")
flags.DEFINE_integer("max_sequences_per_pack", 3, "S of packed training data, checked against its metadata.json "
                                                 "when given (ignored for padded/bucketed).")
flags.DEFINE_enum("input_mode", None, ["packed", "padded", "bucketed"], "How the training data is read (default: "
                                                                        "packed when its metadata.json says packed, "
                                                                        "else padded, as the reference reads it).")
flags.DEFINE_list("bucket_boundaries", [], "Lengths batches are trimmed to in bucketed mode.")
flags.DEFINE_bool("adjust_betas_for_packing", False, "Raise the betas to the power of the packing factor.")
flags.DEFINE_bool("adjust_batch_for_packing", False, "Batch correction: --train_batch_size counts unpacked rows, and "
                                                     "a micro-batch takes round(train_batch_size / packing factor) "
                                                     "packs (the packing factor of the data's metadata.json), so "
                                                     "that an update holds on average as many sequences as unpacked.")
flags.DEFINE_enum("loss_averaging", "token", ["token", "sequence"], "MLM loss basis.")
flags.DEFINE_integer("seed", 12345, "Seed for initialisation, data order and dropout.")
flags.DEFINE_bool("deterministic", False, "Same flags, same results (op determinism, fixed data order).")
flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16", "fp16"], "fp16 uses dynamic loss scaling.")
flags.DEFINE_bool("xla", False, "Compile the forward and backward pass with XLA.")
flags.DEFINE_enum("distribution_strategy", "default", ["default", "mirrored", "multi_worker_mirrored", "tpu"],
                  "tf.distribute strategy (multi_worker_mirrored reads TF_CONFIG).")
flags.DEFINE_float("target_mlm_accuracy", 0.720, "Stop when evaluation reaches this masked-LM accuracy.")
flags.DEFINE_integer("eval_every_samples", -1, "Evaluate every this many sequences; -1: the MLPerf cadence; "
                                               "0: once at the end.")
flags.DEFINE_integer("log_every_steps", 10, "Progress line every this many micro-steps.")
flags.DEFINE_string("submission_org", "unsubmitted", "MLPerf submission_org in mllog.txt.")
flags.DEFINE_string("submission_platform", "unsubmitted", "MLPerf submission_platform in mllog.txt.")
flags.DEFINE_enum("submission_division", "closed", ["closed", "open"], "MLPerf submission_division.")
flags.DEFINE_enum("submission_status", "onprem", ["onprem", "cloud", "preview", "research"],
                  "MLPerf submission_status.")
flags.mark_flags_as_required(["bert_config_file", "output_dir"])

PROGRAM = "run_pretraining"
# A run stopped by SIGTERM after saving (preempted): BSD EX_TEMPFAIL, "try again".
EXIT_STOPPED = 75


def mlperf_eval_every_samples(sequences_per_update: float) -> int:
    """floor(0.05 * (230.23 * global batch + 3,000,000) / 25,000) * 25,000 (docs/training.md).

    >>> mlperf_eval_every_samples(448)
    150000
    """
    return int(0.05 * (230.23 * sequences_per_update + 3_000_000) // 25_000) * 25_000


def data_description(files: list[str], what: str, expect_packed: bool | None, input_mode: str) -> DatasetInfo:
    """Checks the flags against the data's metadata.json; returns what the data is.

    Args:
      files: the data files (metadata.json sits beside the first).
      what: the flag that named them, for messages.
      expect_packed: True or False for training data (--input_mode decides); None for eval data,
        which may be either.
      input_mode: how the training data is read, for messages.

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
        raise SettingsError(f"{what}: packed data (metadata.json), but --input_mode={input_mode} reads "
                            f"unpacked records; use --input_mode=packed")
    if expect_packed and not info.packed:
        raise SettingsError(f"{what}: unpacked data, but --input_mode=packed; pack it with "
                            f"scripts/pack_pretraining_data.py or use --input_mode=padded")
    depth = info.shapes.max_sequences_per_pack
    if expect_packed and FLAGS["max_sequences_per_pack"].present and depth != FLAGS.max_sequences_per_pack:
        raise SettingsError(f"{what}: packed with max_sequences_per_pack={depth}, "
                            f"but --max_sequences_per_pack={FLAGS.max_sequences_per_pack}")
    found = {"max_seq_length": info.shapes.max_seq_length,
             "max_predictions_per_seq": info.shapes.max_predictions_per_seq}
    for name, value in found.items():
        if value != getattr(FLAGS, name):
            raise SettingsError(f"{what}: the data has {name}={value}, but --{name}={getattr(FLAGS, name)}")
    return info


def one_of_two_spellings(ours: str, reference: str, convert=lambda value: value):
    """The value of a flag that has two names (ours and the reference's); both given must agree.

    Args:
      ours, reference: the two flag names.
      convert: maps the reference flag's value to ours (log_epsilon -> epsilon, say).
    """
    mine, theirs = FLAGS[ours], FLAGS[reference]
    if not theirs.present:
        return mine.value
    value = convert(theirs.value)
    same = math.isclose(value, mine.value) if isinstance(value, float) else value == mine.value
    if mine.present and not same:
        raise SettingsError(f"--{ours}={mine.value} and --{reference}={theirs.value} disagree; give one of them")
    return value


def strategy_name() -> str:
    """--distribution_strategy, after the reference's --use_tpu and --num_gpus."""
    name, explicit = FLAGS.distribution_strategy, FLAGS["distribution_strategy"].present
    wanted = "tpu" if FLAGS.use_tpu else "mirrored" if FLAGS.num_gpus > 1 else None
    if wanted is None:
        return name
    if explicit and name != wanted:
        what = "--use_tpu" if FLAGS.use_tpu else f"--num_gpus={FLAGS.num_gpus}"
        raise SettingsError(f"{what} asks for --distribution_strategy={wanted}, but --distribution_strategy={name}")
    return wanted


def check_reference_flags() -> None:
    """The reference flags that cannot be honoured here, named."""
    if not FLAGS.do_train and not FLAGS.do_eval:
        raise SettingsError("--do_train and --do_eval are both false: nothing to do")
    if FLAGS.master and not FLAGS.use_tpu:
        raise SettingsError(f"--master={FLAGS.master}: cannot be honoured without --use_tpu (it is the TF1 master of "
                            f"a TPU job; other jobs here use tf.distribute and TF_CONFIG)")
    if FLAGS.num_gpus > 0:
        import tensorflow as tf

        visible = len(tf.config.list_physical_devices("GPU"))
        if visible < FLAGS.num_gpus:
            raise SettingsError(f"--num_gpus={FLAGS.num_gpus}: cannot be honoured, {visible} GPUs are visible")


def make_strategy():
    import tensorflow as tf

    name = strategy_name()
    if name == "mirrored":
        devices = [f"/gpu:{i}" for i in range(FLAGS.num_gpus)] if FLAGS.num_gpus > 1 else None
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=one_of_two_spellings("tpu", "tpu_name") or FLAGS.master, zone=FLAGS.tpu_zone,
            project=FLAGS.gcp_project)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        if FLAGS["num_tpu_cores"].present and strategy.num_replicas_in_sync != FLAGS.num_tpu_cores:
            raise SettingsError(f"--num_tpu_cores={FLAGS.num_tpu_cores}, but the TPU has "
                                f"{strategy.num_replicas_in_sync} cores")
        return strategy
    return tf.distribute.get_strategy()


def build_config():
    """Flags -> TrainConfig, after every check that needs no model."""
    from bert_packed.model import BertConfig
    from bert_packed.training.config import (
        EvalData,
        ModelConfig,
        OptimizerConfig,
        RunConfig,
        Submission,
        TrainConfig,
        TrainData,
    )

    check_reference_flags()
    input_pattern = one_of_two_spellings("input_files", "input_file")
    if not input_pattern:
        raise SettingsError("--input_file (or --input_files) is required")
    epsilon = one_of_two_spellings("epsilon", "log_epsilon", lambda log: 10.0 ** log)
    if FLAGS.steps_per_update < 1 or FLAGS.train_batch_size < 1 or FLAGS.num_train_steps < 1:
        raise SettingsError("--steps_per_update, --train_batch_size and --num_train_steps must be >= 1")
    if FLAGS.num_train_steps < FLAGS.steps_per_update:
        raise SettingsError(f"--num_train_steps={FLAGS.num_train_steps} is less than one update of "
                            f"--steps_per_update={FLAGS.steps_per_update} micro-steps")
    if FLAGS.num_warmup_steps > FLAGS.num_train_steps:
        raise SettingsError(f"--num_warmup_steps={FLAGS.num_warmup_steps} exceeds "
                            f"--num_train_steps={FLAGS.num_train_steps}")
    if FLAGS.iterations_per_loop < 1 or FLAGS.save_checkpoints_steps < 1 or FLAGS.keep_checkpoint_max < 1:
        raise SettingsError("--iterations_per_loop, --save_checkpoints_steps and --keep_checkpoint_max must be >= 1")
    if FLAGS.seed < 0:
        raise SettingsError(f"--seed={FLAGS.seed}: must be >= 0")
    if FLAGS.max_eval_steps is not None and FLAGS.max_eval_steps < 1:
        raise SettingsError(f"--max_eval_steps={FLAGS.max_eval_steps}: must be >= 1")
    if strategy_name() == "tpu" and not (one_of_two_spellings("tpu", "tpu_name") or FLAGS.master):
        raise SettingsError("--use_tpu (--distribution_strategy=tpu) needs --tpu_name (or --tpu, or --master)")
    input_files = expand_globs(input_pattern, "--input_file")
    input_mode = FLAGS.input_mode or ("packed" if getattr(dataset_info_of_files(input_files), "packed", False)
                                      else "padded")
    packed = input_mode == "packed"
    for name in ("adjust_betas_for_packing", "adjust_batch_for_packing"):
        if FLAGS[name].value and not packed:
            raise SettingsError(f"--{name} needs packed data, not --input_mode={input_mode}")
    if FLAGS.bucket_boundaries and input_mode != "bucketed":
        raise SettingsError("--bucket_boundaries is for --input_mode=bucketed")
    bert_config = BertConfig.from_json_file(FLAGS.bert_config_file)
    if FLAGS.max_seq_length > bert_config.max_position_embeddings:
        raise SettingsError(f"--max_seq_length={FLAGS.max_seq_length} exceeds max_position_embeddings="
                            f"{bert_config.max_position_embeddings} of {FLAGS.bert_config_file}")
    eval_pattern = FLAGS.eval_files or (input_pattern if FLAGS.do_eval else None)
    eval_data = EvalData(target_mlm_accuracy=FLAGS.target_mlm_accuracy, max_steps=FLAGS.max_eval_steps)
    batch_size = FLAGS.train_batch_size
    if FLAGS.do_train:
        train_info = data_description(input_files, "--input_file", packed, input_mode)
        if FLAGS.adjust_batch_for_packing:
            batch_size = corrected_batch_size(FLAGS.train_batch_size, train_info.packing_factor)
    else:  # evaluation alone: --input_file is the eval set, as in the reference
        train_info = DatasetInfo(False, Shapes(FLAGS.max_seq_length, FLAGS.max_predictions_per_seq), 0, 0,
                                 tuple(input_files))
    train_data = TrainData(tuple(input_files), train_info.shapes, input_mode, train_info.packing_factor,
                           train_info.num_sequences, batch_size, FLAGS.steps_per_update,
                           tuple(int(b) for b in FLAGS.bucket_boundaries))
    if FLAGS.adjust_batch_for_packing:
        logging.info("--adjust_batch_for_packing: %d packs a micro-batch instead of %d rows at packing factor %.3f: "
                     "%.1f sequences an update on average (unpacked: %d)", batch_size, FLAGS.train_batch_size,
                     train_data.packing_factor, train_data.sequences_per_update,
                     FLAGS.train_batch_size * FLAGS.steps_per_update)
    if eval_pattern:
        eval_files = expand_globs(eval_pattern, "--eval_files" if FLAGS.eval_files else "--input_file")
        eval_info = data_description(eval_files, "--eval_files" if FLAGS.eval_files else "--input_file", None,
                                     input_mode)
        every = FLAGS.eval_every_samples
        if every < 0:
            every = mlperf_eval_every_samples(train_data.sequences_per_update)
        eval_data = EvalData(tuple(eval_files), eval_info.shapes, eval_info.packed, FLAGS.eval_batch_size, every,
                             FLAGS.target_mlm_accuracy, FLAGS.max_eval_steps)
    _say_how_cadences_round()
    return TrainConfig(
        model=ModelConfig(bert_config, FLAGS.init_checkpoint, FLAGS.loss_averaging, FLAGS.precision, FLAGS.xla),
        train_data=train_data,
        optimizer=OptimizerConfig(FLAGS.optimizer, FLAGS.learning_rate, FLAGS.num_train_steps, FLAGS.num_warmup_steps,
                                  FLAGS.start_warmup_step, FLAGS.lamb_beta_1, FLAGS.lamb_beta_2,
                                  FLAGS.lamb_weight_decay_rate, epsilon, FLAGS.adjust_betas_for_packing,
                                  FLAGS.poly_power, FLAGS.clip_by_global_norm_after_gradient_allreduce),
        run=RunConfig(FLAGS.output_dir, FLAGS.seed, FLAGS.deterministic, FLAGS.save_checkpoints_steps,
                      FLAGS.keep_checkpoint_max, FLAGS.iterations_per_loop, FLAGS.log_every_steps,
                      command_flags_text(),
                      Submission(FLAGS.submission_org, FLAGS.submission_platform, FLAGS.submission_division,
                                 FLAGS.submission_status)),
        eval_data=eval_data)


def corrected_batch_size(unpacked_rows: int, packing_factor: float, num_replicas: int = 1) -> int:
    """Packs per micro-batch that hold on average as many sequences as `unpacked_rows` rows: a
    multiple of the replicas, which share a micro-batch evenly.

    For example, 8 unpacked rows at packing factor 1.203 become 7 packs: 8.42 sequences a
    micro-batch on average; 448 rows at packing factor 2.012 on 8 replicas become 224 packs.
    """
    return max(1, round(unpacked_rows / packing_factor / num_replicas)) * num_replicas


def batch_for_replicas(config, num_replicas: int):
    """The config with a batch-corrected micro-batch rounded to a multiple of the replicas, which
    share it evenly (the strategy, and so their number, comes after every check)."""
    batch_size = config.train_data.batch_size
    if not FLAGS.adjust_batch_for_packing or batch_size % num_replicas == 0:
        return config
    rounded = corrected_batch_size(FLAGS.train_batch_size, config.train_data.packing_factor, num_replicas)
    logging.info("--adjust_batch_for_packing: %d packs rounded to %d, a multiple of the %d replicas", batch_size,
                 rounded, num_replicas)
    return dataclasses.replace(config, train_data=dataclasses.replace(config.train_data, batch_size=rounded))


def _say_how_cadences_round() -> None:
    """Micro-step counts that do not fall on whole updates or compiled loops round up, as on the
    reference's TPU (checkpoints and evaluations only between loops); said once, here."""
    n, loop = FLAGS.steps_per_update, FLAGS.iterations_per_loop
    if FLAGS.num_train_steps % n:
        logging.warning("--num_train_steps=%d is not a multiple of --steps_per_update=%d: the last %d micro-steps "
                        "make no update and are not run", FLAGS.num_train_steps, n, FLAGS.num_train_steps % n)
    loop_steps = -(-loop // n) * n
    if loop_steps != loop:
        logging.warning("--iterations_per_loop=%d rounds up to %d, whole updates of --steps_per_update=%d", loop,
                        loop_steps, n)
    if FLAGS.save_checkpoints_steps % loop_steps:
        logging.warning("--save_checkpoints_steps=%d is not a multiple of the loop of %d micro-steps: checkpoints "
                        "every %d", FLAGS.save_checkpoints_steps, loop_steps,
                        -(-FLAGS.save_checkpoints_steps // loop_steps) * loop_steps)
    if loop_steps > 1 and (FLAGS.eval_files or FLAGS.do_eval):
        logging.warning("evaluations happen between compiled loops of %d micro-steps: each at the first loop end "
                        "after its cadence", loop_steps)


def main(argv):
    del argv
    import_tensorflow(FLAGS.verbosity)
    logging.getLogger().setLevel(logging.INFO)
    from bert_packed.training.trainer import Trainer

    config = build_config()  # every check of flags and data, before any device is touched
    strategy = make_strategy()
    trainer = Trainer(batch_for_replicas(config, strategy.num_replicas_in_sync), strategy)
    result = trainer.train() if FLAGS.do_train else trainer.evaluate_only()
    print(json.dumps(result))
    if trainer.stopped_by_signal:
        step = int(trainer.step.numpy())
        exit_with(EXIT_STOPPED, f"{PROGRAM}: stopped by SIGTERM after saving step {step}; the same command "
                                f"resumes (exit status {EXIT_STOPPED})")


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
