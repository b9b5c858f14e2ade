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

from absl import flags

from bert_packed.cli.common import command_flags_text, exit_if_stopped, run
from bert_packed.cli.settings_flags import define_flags
from bert_packed.dataset_info import one_reading_per_file
from bert_packed.errors import SettingsError
from bert_packed.run_directory import EVAL_RESULTS, RunDirectory
from bert_packed.settings import first_run_settings, help_groups, settings_of
from bert_packed.tensorflow_loading import import_tensorflow
from bert_packed.training.assemble import CommandLine, assemble
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


def cluster_of_this_task():
    """The cluster this process is a task of (a TensorFlow ClusterResolver) under
    multi_worker_mirrored, else None; the distribution flags that cannot be honoured, named.

    It comes first: under Slurm the resolver gives this task its GPUs (CUDA_VISIBLE_DEVICES),
    before any GPU is used, and a wrong launch is said before any other work.
    """
    from bert_packed.training import distribution

    name = command_line().strategy_name()
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

    name = command_line().strategy_name()
    if name == "mirrored":
        devices = [f"/gpu:{i}" for i in range(FLAGS.num_gpus)] if FLAGS.num_gpus > 1 else None
        return distribution.mirrored(devices, FLAGS.all_reduce_alg)
    if name == "multi_worker_mirrored":
        if FLAGS.cluster_wait_seconds <= 0:
            raise SettingsError(f"--cluster_wait_seconds={FLAGS.cluster_wait_seconds:g}: expected a wait above 0")
        return distribution.multi_worker_mirrored(cluster, FLAGS.all_reduce_alg, FLAGS.cluster_wait_seconds)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=command_line().spelled("tpu", "tpu_name") or FLAGS.master, zone=FLAGS.tpu_zone,
            project=FLAGS.gcp_project)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        if FLAGS["num_tpu_cores"].present and strategy.num_replicas_in_sync != FLAGS.num_tpu_cores:
            raise SettingsError(f"--num_tpu_cores={FLAGS.num_tpu_cores}, but the TPU has "
                                f"{strategy.num_replicas_in_sync} cores")
        return strategy
    return tf.distribute.get_strategy()


def command_line() -> CommandLine:
    """The flags, each by its name, and which of them were given."""
    names = [field.name for field in settings_of(*SETTINGS)]
    return CommandLine({name: FLAGS[name].value for name in names},
                       frozenset(name for name in names if FLAGS[name].present))


def build_config():
    """Flags -> (TrainConfig, TrainData, EvalData) (bert_packed.training.assemble)."""
    return assemble(command_line(), command_flags_text())


def main(argv):
    del argv
    import_tensorflow(FLAGS.verbosity)
    from bert_packed.training.distribution import leave_together
    from bert_packed.training.loop import evaluate_only, train_and_evaluate
    from bert_packed.training.memory import check_replica_memory
    from bert_packed.training.process import set_up_process
    from bert_packed.training.step import shared_step

    cluster = cluster_of_this_task()
    with one_reading_per_file():  # each file's size and first 64 KiB read once: one request on a bucket
        config, train_data, eval_data = build_config()  # every check of flags and data, before any device is touched
    set_up_process(config)
    strategy = make_strategy(cluster)
    if FLAGS.do_train:  # before anything compiles
        check_replica_memory(config, train_data, strategy)
    step = shared_step(config, train_data, strategy)
    if not FLAGS.do_train:
        record = evaluate_only(config, eval_data, step)
        leave_together(step.strategy)
        print(f"{PROGRAM}: evaluated {record['checkpoint']} (step {record['step']}): masked-LM accuracy "
              f"{record.get('mlm_accuracy', 0):.4f}, loss {record.get('loss', 0):.4f} over "
              f"{record.get('num_sequences', 0):,.0f} sequences -> {RunDirectory(config.run.output_dir).file(EVAL_RESULTS)}")
        return
    result = train_and_evaluate(config, train_data, eval_data, step)
    leave_together(step.strategy)  # the chief last: its process holds the workers' coordination service
    exit_if_stopped(PROGRAM, result)
    from bert_packed.training.report import run_summary

    bert = config.model.bert
    print("\n".join(run_summary(result.directory, config.eval.target_mlm_accuracy, config.run.submission_division,
                                 bool(eval_data.files), (bert.hidden_size, bert.num_hidden_layers) == (1024, 24))))


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
