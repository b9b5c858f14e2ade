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

import logging
import math

from absl import flags

from bert_packed.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_TRY_AGAIN,
    command_flags_text,
    exit_with,
    expand_globs,
    require_disjoint,
    run,
)
from bert_packed.cli.settings_flags import define_flags
from bert_packed.dataset_info import one_reading_per_file, shapes_given_or_recorded
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.run_directory import EVAL_RESULTS, RunDirectory
from bert_packed.settings import first_run_settings, help_groups
from bert_packed.tensorflow_loading import import_tensorflow
from bert_packed.training.config import (
    DISTRIBUTION_GROUP,
    MLPERF_GROUP,
    RUN_GROUP,
    BatchConfig,
    EvalConfig,
    LaunchSettings,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    make_config,
    setting_names,
)

FLAGS = flags.FLAGS
# Every flag of the reference's run_pretraining.py and optimization.py, with the reference's
# meaning, and this project's: one a setting (bert_packed.training.config), its default and help there.
SETTINGS = (LaunchSettings, ModelConfig, BatchConfig, OptimizerConfig, EvalConfig, RunConfig)
define_flags(*SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["bert_config_file", "output_dir"])

# --help lists the flags by purpose (every flag is in one group), marking what a first run sets.
_GROUPS = help_groups(*SETTINGS)
HELP_GROUPS = {group: _GROUPS[group] for group in ("data", "model", "batch and schedule", "optimizer", "evaluation",
                                                   RUN_GROUP, DISTRIBUTION_GROUP, MLPERF_GROUP)}
FIRST_RUN = first_run_settings(*SETTINGS)

PROGRAM = "run_pretraining"
# A run stopped by a signal after saving: SIGTERM (preempted) gives BSD's EX_TEMPFAIL, "try
# again"; SIGINT (Ctrl-C) the shell's 128 + 2.
EXIT_STATUS = {"SIGTERM": EXIT_TRY_AGAIN, "SIGINT": EXIT_INTERRUPTED}


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
    if explicit and name == "multi_worker_mirrored" and not FLAGS.use_tpu:
        raise SettingsError(f"--num_gpus={FLAGS.num_gpus} mirrors over one host's GPUs, but under "
                            f"--distribution_strategy=multi_worker_mirrored each worker trains on every GPU it sees: "
                            f"leave --num_gpus out")
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
    if strategy_name() == "tpu" and not (one_of_two_spellings("tpu", "tpu_name") or FLAGS.master):
        raise SettingsError("--use_tpu (--distribution_strategy=tpu) needs --tpu_name (or --tpu, or --master)")
    if FLAGS.num_gpus > 0:
        import tensorflow as tf

        visible = len(tf.config.list_physical_devices("GPU"))
        if visible < FLAGS.num_gpus:
            raise SettingsError(f"--num_gpus={FLAGS.num_gpus}: cannot be honoured, {visible} GPUs are visible")


def cluster_of_this_task():
    """The cluster this process is a task of (a TensorFlow ClusterResolver) under
    multi_worker_mirrored, else None; the distribution flags that cannot be honoured, named.

    It comes first: under Slurm the resolver gives this task its GPUs (CUDA_VISIBLE_DEVICES),
    before any GPU is used, and a wrong launch is said before any other work.
    """
    from bert_packed.training import distribution

    name = strategy_name()
    if name == "multi_worker_mirrored":
        return distribution.cluster_resolver(FLAGS.cluster_resolver, FLAGS.slurm_port_base)
    if FLAGS["cluster_resolver"].present:
        raise SettingsError(f"--cluster_resolver={FLAGS.cluster_resolver} applies to "
                            f"--distribution_strategy=multi_worker_mirrored, not {name}")
    if FLAGS["all_reduce_alg"].present and name != "mirrored":
        raise SettingsError(f"--all_reduce_alg={FLAGS.all_reduce_alg} applies to --distribution_strategy=mirrored "
                            f"(--num_gpus) or multi_worker_mirrored, not {name}")
    if name in ("default", "mirrored"):
        tasks, variable = distribution.tasks_in_environment()
        if tasks > 1:
            what = f"--num_gpus={FLAGS.num_gpus}" if FLAGS.num_gpus > 1 else f"--distribution_strategy={name}"
            raise SettingsError(f"{what} trains on this host alone, but {variable} names {tasks} tasks (a multi-worker "
                                f"cluster): give --distribution_strategy=multi_worker_mirrored, under which each "
                                f"worker trains on every GPU it sees")
    return None


def make_strategy(cluster):
    """The tf.distribute strategy the flags ask for; `cluster`: what cluster_of_this_task returned."""
    import tensorflow as tf

    from bert_packed.training import distribution

    name = strategy_name()
    if name == "mirrored":
        devices = [f"/gpu:{i}" for i in range(FLAGS.num_gpus)] if FLAGS.num_gpus > 1 else None
        return distribution.mirrored(devices, FLAGS.all_reduce_alg)
    if name == "multi_worker_mirrored":
        return distribution.multi_worker_mirrored(cluster, FLAGS.all_reduce_alg)
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
    """Flags -> (TrainConfig, TrainData, EvalData): every setting from the flag of its name (the
    parts check themselves), then the data described and checked against the settings (no device
    is touched)."""
    from bert_packed.model import BertConfig
    from bert_packed.model.huggingface import is_huggingface_directory, require_export_directory, require_same_model
    from bert_packed.pretraining_data.tokenization import vocabulary_path
    from bert_packed.training import data, provenance

    check_reference_flags()
    input_pattern = one_of_two_spellings("input_files", "input_file")
    if not input_pattern:
        raise SettingsError("--input_file (or --input_files) is required")
    input_files = expand_globs(input_pattern, "--input_file")
    settings = {name: FLAGS[name].value for name in setting_names() if name in FLAGS}
    config = make_config(**{**settings, "bert": BertConfig.from_json_file(FLAGS.bert_config_file),
                            "vocab_file": vocabulary_path(FLAGS.vocab_file),
                            "epsilon": one_of_two_spellings("epsilon", "log_epsilon", lambda log: 10.0 ** log),
                            "bucket_boundaries": tuple(int(b) for b in FLAGS.bucket_boundaries),
                            "flags_text": command_flags_text()})
    if config.model.init_checkpoint and is_huggingface_directory(config.model.init_checkpoint):
        require_same_model(config.model.init_checkpoint, config.model.bert)
    if config.run.export_huggingface_dir:
        require_export_directory(config.run.export_huggingface_dir, config.run.vocab_file, config.run.do_lower_case,
                                 config.model.bert, config.run.output_dir)
    given = [FLAGS[name].value if FLAGS[name].present else None for name in ("max_seq_length",
                                                                           "max_predictions_per_seq")]
    shapes = Shapes(*shapes_given_or_recorded(input_files, *given, defaults=(FLAGS["max_seq_length"].default,
                                                                           FLAGS["max_predictions_per_seq"].default)),
                    FLAGS.max_sequences_per_pack)
    if FLAGS.do_train:
        train_data = data.train_data(input_files, shapes, config, FLAGS["max_sequences_per_pack"].present,
                                     FLAGS.train_on_held_out_files, RunDirectory(FLAGS.output_dir))
    else:  # evaluation alone: --input_file is the eval set, as in the reference
        train_data = data.TrainData(files=tuple(input_files), identity=(), shapes=shapes.unpacked(),
                                    input_mode="padded")
    eval_pattern = FLAGS.eval_files or (input_pattern if FLAGS.do_eval else None)
    if FLAGS.do_train and FLAGS.do_eval and not FLAGS.eval_files:
        logging.warning("--do_eval without --eval_files evaluates on the training files, as the reference does: "
                        "its accuracy is not a held-out one (MLPerf never evaluates on what it trains on); give "
                        "--eval_files")
    eval_data = data.EvalData()
    if eval_pattern:
        flag = "--eval_files" if FLAGS.eval_files else "--input_file"
        eval_files = expand_globs(eval_pattern, flag)
        if FLAGS.do_train and FLAGS.eval_files:
            require_disjoint(input_files, "--input_file", eval_files, flag)
            provenance.require_apart(input_files, eval_files, flag)
        eval_data = data.eval_data(eval_files, flag, shapes, config)
    return config, train_data, eval_data


def main(argv):
    del argv
    import_tensorflow(FLAGS.verbosity)
    from bert_packed.training.distribution import leave_together
    from bert_packed.training.loop import evaluate_only, train_and_evaluate
    from bert_packed.training.memory import check_replica_memory
    from bert_packed.training.process import set_up_process
    from bert_packed.training.step import CompiledStep

    cluster = cluster_of_this_task()
    with one_reading_per_file():  # each file's size and first 64 KiB read once: one request on a bucket
        config, train_data, eval_data = build_config()  # every check of flags and data, before any device is touched
    set_up_process(config)
    strategy = make_strategy(cluster)
    if FLAGS.do_train:  # before anything compiles
        check_replica_memory(config, train_data, strategy)
    step = CompiledStep(config, train_data, strategy)
    if not FLAGS.do_train:
        record = evaluate_only(config, eval_data, step)
        leave_together(step.strategy)
        print(f"{PROGRAM}: evaluated {record['checkpoint']} (step {record['step']}): masked-LM accuracy "
              f"{record.get('mlm_accuracy', 0):.4f}, loss {record.get('loss', 0):.4f} over "
              f"{record.get('num_sequences', 0):,.0f} sequences -> {RunDirectory(config.run.output_dir).file(EVAL_RESULTS)}")
        return
    result = train_and_evaluate(config, train_data, eval_data, step)
    leave_together(step.strategy)  # the chief last: its process holds the workers' coordination service
    if result.stopped_by:
        status = EXIT_STATUS[result.stopped_by]
        if not result.step:
            exit_with(status, f"{PROGRAM}: stopped by {result.stopped_by} before the first step; the same command "
                              f"starts the run (exit status {status})")
        exit_with(status, f"{PROGRAM}: stopped by {result.stopped_by} after saving step {result.step}; the same "
                          f"command resumes (exit status {status})")
    from bert_packed.training.report import run_summary

    print("\n".join(run_summary(result.directory, config.eval.target_mlm_accuracy, config.run.submission_division,
                                 bool(eval_data.files))))


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
