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
from bert_packed.dataset_info import one_reading_per_file, shapes_given_or_recorded
from bert_packed.errors import SettingsError
from bert_packed.features import EVAL_INPUT_MODES, INPUT_MODES, Shapes
from bert_packed.run_directory import EVAL_RESULTS, RunDirectory
from bert_packed.tensorflow_loading import import_tensorflow
from bert_packed.training.config import (
    ALL_REDUCE_ALGORITHMS,
    CLUSTER_RESOLVERS,
    DIVISIONS,
    LOSS_AVERAGING,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SLURM_PORT_BASE,
    STATUSES,
    BatchConfig,
    EvalConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    make_config,
    setting_names,
)

FLAGS = flags.FLAGS
# The reference's flags (run_pretraining.py and optimization.py), with the reference's meaning.
# Defaults come from the config parts (bert_packed.training.config); "reference default" notes
# where the reference's differs.
flags.DEFINE_string("bert_config_file", None, "google-research bert_config.json.")
flags.DEFINE_string("input_file", None, "Comma-separated globs of training TFRecords (the reference's name of "
                                        "--input_files). With --do_eval alone: the eval set.")
flags.DEFINE_string("output_dir", None, "Logs, checkpoints, TensorBoard; a run restarted here resumes.")
flags.DEFINE_string("init_checkpoint", ModelConfig.init_checkpoint, "Weights to start from: a google-research/MLPerf "
                    "TF1 checkpoint, or a Hugging Face BERT directory (config.json, model.safetensors).")
flags.DEFINE_string("export_huggingface_dir", RunConfig.export_huggingface_dir, "When the run finishes, also write "
                    "its weights there as a Hugging Face BERT directory (scripts/export_model.py does it for any run).")
flags.DEFINE_string("vocab_file", RunConfig.vocab_file, "The vocabulary of the data, for --export_huggingface_dir's "
                                                        "tokenizer.")
flags.DEFINE_bool("do_lower_case", RunConfig.do_lower_case, "The data was lower-cased (uncased), for "
                                                            "--export_huggingface_dir's tokenizer.")
flags.DEFINE_integer("max_seq_length", 512, "L of the data (default: as the training data's metadata.json records, "
                                            "else 512; the reference's default is 128).")
flags.DEFINE_integer("max_predictions_per_seq", 76, "P of the data; packs hold P + S (default: as metadata.json "
                                                    "records, else 76; the reference's default is 20).")
flags.DEFINE_bool("do_train", True, "Train (reference default False: there both do_* are given).")
flags.DEFINE_bool("do_eval", False, "Evaluate: alone, once, the latest checkpoint of --output_dir or "
                                    "--init_checkpoint; with --do_train, during training, on --eval_files or else "
                                    "on --input_file.")
flags.DEFINE_integer("train_batch_size", BatchConfig.train_batch_size, "Rows per micro-batch, all replicas: packs when packed, "
                                                               "unpacked rows with --adjust_batch_for_packing "
                                                               "(reference default 32).")
flags.DEFINE_integer("eval_batch_size", EvalConfig.eval_batch_size, "Rows per eval batch, all replicas.")
flags.DEFINE_enum("optimizer", OptimizerConfig.optimizer, list(OPTIMIZERS), "LAMB (MLPerf) or AdamW (original BERT; the "
                                                                       "reference's default).")
flags.DEFINE_float("learning_rate", OptimizerConfig.learning_rate, "Peak learning rate (reference default 5e-5).")
flags.DEFINE_float("poly_power", OptimizerConfig.poly_power, "Power of the polynomial learning-rate decay.")
flags.DEFINE_integer("num_train_steps", OptimizerConfig.num_train_steps, "Micro-steps (reference default 100000); "
                                                                         "updates are num_train_steps // "
                                                                         "steps_per_update.")
flags.DEFINE_integer("num_warmup_steps", OptimizerConfig.num_warmup_steps, "Linear warmup micro-steps (reference "
                                                                           "default 10000).")
flags.DEFINE_integer("start_warmup_step", OptimizerConfig.start_warmup_step, "Warmup origin in micro-steps "
                                                                             "(negative: start partway through).")
flags.DEFINE_integer("save_checkpoints_steps", RunConfig.save_checkpoints_steps, "Checkpoint every this many "
                                                                                 "micro-steps (and at the end), "
                                                                                 "rounded up to whole compiled loops.")
flags.DEFINE_integer("iterations_per_loop", RunConfig.iterations_per_loop, "Micro-steps in one compiled call, no host "
                                                                           "reads inside; logs, checkpoints and "
                                                                           "evaluations happen between calls "
                                                                           "(reference default 1000).")
flags.DEFINE_integer("max_eval_steps", EvalConfig.max_eval_steps, "Evaluate at most this many batches (default: the whole "
                                                           "eval set; reference default 100).")
flags.DEFINE_bool("use_tpu", False, "Run on a TPU (--tpu_name or --master names it).")
flags.DEFINE_string("tpu_name", None, "TPU name or grpc:// address (the reference's name of --tpu).")
flags.DEFINE_string("tpu_zone", None, "GCE zone of the TPU (default: detected).")
flags.DEFINE_string("gcp_project", None, "GCP project of the TPU (default: detected).")
flags.DEFINE_string("master", None, "TPU master address, used with --use_tpu when --tpu_name is not given.")
flags.DEFINE_integer("num_tpu_cores", 8, "TPU cores; checked against the TPU found when given.")
flags.DEFINE_integer("num_gpus", 0, "GPUs: more than 1 mirrors over that many (--distribution_strategy=mirrored); "
                                    "checked against the GPUs visible.")
flags.DEFINE_integer("steps_per_update", BatchConfig.steps_per_update, "Micro-batches accumulated into one update.")
flags.DEFINE_integer("keep_checkpoint_max", RunConfig.keep_checkpoint_max, "Checkpoints kept.")
flags.DEFINE_bool("start_over_if_no_checkpoint_restores", RunConfig.start_over_if_no_checkpoint_restores,
                  "When --output_dir holds checkpoints and none restores, train from step 0, emptying the run's "
                  "logs; without it the run stops, naming them (a storage error may pass: run again first).")
flags.DEFINE_float("lamb_weight_decay_rate", OptimizerConfig.lamb_weight_decay_rate, "Weight decay inside the update.")
flags.DEFINE_float("lamb_beta_1", OptimizerConfig.lamb_beta_1, "beta_1 (before any packing adjustment).")
flags.DEFINE_float("lamb_beta_2", OptimizerConfig.lamb_beta_2, "beta_2 (before any packing adjustment).")
flags.DEFINE_float("log_epsilon", math.log10(OptimizerConfig.epsilon), "Optimizer epsilon is 10**log_epsilon (or "
                                                                       "give --epsilon).")
flags.DEFINE_bool("clip_by_global_norm_after_gradient_allreduce",
                  OptimizerConfig.clip_by_global_norm_after_gradient_allreduce,
                  "Clip the gradient of the whole update (summed over replicas and micro-batches) to norm 1; "
                  "default, as the reference: clip each replica's gradient of each micro-batch, then average.")
# This project's flags.
flags.DEFINE_string("input_files", None, "Comma-separated globs of training TFRecords (= --input_file).")
flags.DEFINE_string("eval_files", None, "Comma-separated globs of evaluation TFRecords (packed or unpacked).")
flags.DEFINE_float("epsilon", OptimizerConfig.epsilon, "Optimizer epsilon (= 10**--log_epsilon).")
flags.DEFINE_string("tpu", None, "TPU name or address (= --tpu_name).")
flags.DEFINE_integer("max_sequences_per_pack", 3, "S of packed training data, checked against its metadata.json "
                                                 "when given (ignored for padded/bucketed).")
flags.DEFINE_enum("input_mode", BatchConfig.input_mode, list(INPUT_MODES),
                  "How the training data is read (default: packed when its metadata.json says packed, else padded, as "
                  "the reference reads it); packed_online packs unpacked records as they are read.")
flags.DEFINE_list("bucket_boundaries", [], "Lengths batches are trimmed to in bucketed mode.")
flags.DEFINE_integer("online_packing_window", BatchConfig.online_packing_window,
                     "With --input_mode=packed_online (or --eval_input_mode): sequences the packer may hold at once.")
flags.DEFINE_enum("eval_input_mode", EvalConfig.eval_input_mode, list(EVAL_INPUT_MODES),
                  "How the eval files are read (default: as their metadata.json says); packed_online packs unpacked "
                  "eval records as they are read, each once.")
flags.DEFINE_bool("train_on_held_out_files", False, "Let --input_file name a dataset's held-out evaluation files "
                                                    "(eval-*.tfrecord of create_pretraining_data --eval_fraction), "
                                                    "which are otherwise refused as training input.")
flags.DEFINE_bool("adjust_betas_for_packing", OptimizerConfig.adjust_betas_for_packing, "Raise the betas to the power "
                                                                                        "of the packing factor.")
flags.DEFINE_bool("adjust_batch_for_packing", BatchConfig.adjust_batch_for_packing,
                  "Batch correction: --train_batch_size counts unpacked rows, and a micro-batch takes round("
                  "train_batch_size / packing factor) packs (the packing factor of the data's metadata.json), so that "
                  "an update holds on average as many sequences as unpacked.")
flags.DEFINE_enum("loss_averaging", ModelConfig.loss_averaging, list(LOSS_AVERAGING), "MLM loss basis.")
flags.DEFINE_integer("seed", RunConfig.seed, "Seed for initialisation, data order and dropout.")
flags.DEFINE_bool("deterministic", RunConfig.deterministic, "Same flags, same results (op determinism, fixed data "
                                                            "order): bit-equal on a CPU (tested); on a GPU not yet "
                                                            "shown (scripts/device_check.py checks it; "
                                                            "docs/training.md#determinism).")
flags.DEFINE_enum("precision", ModelConfig.precision, list(PRECISIONS), "fp16 uses dynamic loss scaling.")
flags.DEFINE_bool("xla", ModelConfig.xla, "Compile the forward and backward pass with XLA.")
flags.DEFINE_enum("recompute", ModelConfig.recompute, list(RECOMPUTE),
                  "What the backward pass recomputes instead of keeping: none; attention (scores, softmax, dropout, "
                  "probabilities x values: most of a row's memory at L=512); layer (each whole transformer layer). The "
                  "same gradients in less memory, at the cost of time (docs/launch.md#memory).")
flags.DEFINE_bool("nsp_loss", ModelConfig.nsp_loss, "Train the next-sentence head on its loss; --nsp_loss=false: "
                                                    "masked-LM only, no NSP head (RoBERTa's objective; the MLPerf "
                                                    "metric, MLM accuracy, is unchanged).")
flags.DEFINE_enum("distribution_strategy", "default", ["default", "mirrored", "multi_worker_mirrored", "tpu"],
                  "tf.distribute strategy (multi_worker_mirrored: the cluster from --cluster_resolver).")
flags.DEFINE_enum("cluster_resolver", "auto", list(CLUSTER_RESOLVERS),
                  "With multi_worker_mirrored, where the cluster comes from: tf_config (TF_CONFIG, as Kubeflow's TFJob "
                  "sets it), slurm (the Slurm job step srun starts, through TensorFlow's SlurmClusterResolver), or "
                  "auto: TF_CONFIG when set, else Slurm inside a job step, else this host alone.")
flags.DEFINE_integer("slurm_port_base", SLURM_PORT_BASE, "Under Slurm, the port of each host's first task (task k of "
                                                         "a host listens on slurm_port_base + k): open it between the "
                                                         "hosts (TensorFlow's default).")
flags.DEFINE_enum("all_reduce_alg", "auto", list(ALL_REDUCE_ALGORITHMS),
                  "What sums the gradients: nccl (give it on GPUs); ring (TensorFlow's own collectives over gRPC; on "
                  "one host, its reduction to one device); auto: TensorFlow's choice, which under multi_worker_mirrored "
                  "is its ring (docs/launch.md).")
flags.DEFINE_float("target_mlm_accuracy", EvalConfig.target_mlm_accuracy, "Stop when evaluation reaches this masked-LM "
                                                                        "accuracy.")
flags.DEFINE_integer("eval_every_samples", EvalConfig.eval_every_samples, "Evaluate every this many sequences; -1: the "
                                                                   "MLPerf cadence; 0: once at the end.")
flags.DEFINE_integer("log_every_steps", RunConfig.log_every_steps, "Progress line every this many micro-steps.")
flags.DEFINE_string("submission_org", RunConfig.submission_org, "MLPerf submission_org in mllog.txt.")
flags.DEFINE_string("submission_platform", RunConfig.submission_platform, "MLPerf submission_platform in mllog.txt.")
flags.DEFINE_enum("submission_division", RunConfig.submission_division, list(DIVISIONS), "MLPerf submission_division.")
flags.DEFINE_enum("submission_status", RunConfig.submission_status, list(STATUSES),
                  "MLPerf submission_status.")
flags.mark_flags_as_required(["bert_config_file", "output_dir"])

# --help lists the flags by purpose (every flag is in one group), marking what a first run sets.
HELP_GROUPS = {
    "data": ["input_file", "input_files", "eval_files", "input_mode", "eval_input_mode", "max_seq_length",
             "max_predictions_per_seq", "max_sequences_per_pack", "online_packing_window", "bucket_boundaries",
             "train_on_held_out_files"],
    "model": ["bert_config_file", "init_checkpoint", "loss_averaging", "precision", "xla", "recompute", "nsp_loss"],
    "batch and schedule": ["train_batch_size", "adjust_batch_for_packing", "steps_per_update", "num_train_steps",
                           "num_warmup_steps", "start_warmup_step", "poly_power", "learning_rate"],
    "optimizer": ["optimizer", "lamb_beta_1", "lamb_beta_2", "adjust_betas_for_packing", "lamb_weight_decay_rate",
                  "log_epsilon", "epsilon", "clip_by_global_norm_after_gradient_allreduce"],
    "evaluation": ["do_train", "do_eval", "eval_batch_size", "eval_every_samples", "max_eval_steps",
                   "target_mlm_accuracy"],
    "run, checkpoints and logs": ["output_dir", "seed", "deterministic", "save_checkpoints_steps",
                                  "keep_checkpoint_max", "iterations_per_loop", "log_every_steps",
                                  "start_over_if_no_checkpoint_restores", "export_huggingface_dir", "vocab_file",
                                  "do_lower_case"],
    "distribution": ["distribution_strategy", "num_gpus", "cluster_resolver", "slurm_port_base", "all_reduce_alg",
                     "use_tpu", "tpu_name", "tpu", "tpu_zone", "gcp_project", "master", "num_tpu_cores"],
    "MLPerf logging": ["submission_division", "submission_org", "submission_platform", "submission_status"],
}
FIRST_RUN = ("bert_config_file", "input_files", "eval_files", "output_dir", "init_checkpoint", "train_batch_size",
             "num_train_steps", "learning_rate", "max_seq_length", "max_predictions_per_seq")

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
        exit_with(status, f"{PROGRAM}: stopped by {result.stopped_by} after saving step {result.step}; the same "
                          f"command resumes (exit status {status})")
    from bert_packed.training.report import run_summary

    print("\n".join(run_summary(result.directory, config.eval.target_mlm_accuracy, config.run.submission_division,
                                 bool(eval_data.files))))


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
