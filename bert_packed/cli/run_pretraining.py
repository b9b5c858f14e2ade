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
from bert_packed.cli.settings_flags import define_flags, given_flags
from bert_packed.console.tensorflow_loading import import_tensorflow
from bert_packed.settings import first_run_settings, help_groups, settings_of
from bert_packed.storage.run_directory import EVAL_RESULTS
from bert_packed.training.assemble import PretrainingSettings
from bert_packed.training.config import (
    MLPERF_GROUP,
    RUN_GROUP,
    BatchConfig,
    EvalConfig,
    LaunchSettings,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
)
from bert_packed.training.launch import DISTRIBUTION_GROUP, DistributionSettings

FLAGS = flags.FlagValues()
# Every flag of the reference's run_pretraining.py and optimization.py, with the reference's
# meaning, and this project's: one a setting (bert_packed.training.config), its default and help there.
SETTINGS = (LaunchSettings, DistributionSettings, ModelConfig, BatchConfig, OptimizerConfig, EvalConfig, RunConfig)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["bert_config_file", "output_dir"], flag_values=FLAGS)

# --help lists the flags by purpose (every flag is in one group), marking what a first run sets.
_GROUPS = help_groups(*SETTINGS)
HELP_GROUPS = {group: _GROUPS[group] for group in ("data", "model", "batch and schedule", "optimizer", "evaluation",
                                                   RUN_GROUP, DISTRIBUTION_GROUP, MLPERF_GROUP)}
FIRST_RUN = first_run_settings(*SETTINGS)

PROGRAM = "run_pretraining"


def settings_from_flags() -> PretrainingSettings:
    """The flags, each by its name, and which of them were given."""
    return PretrainingSettings({field.name: FLAGS[field.name].value for field in settings_of(*SETTINGS)},
                               given_flags(FLAGS, *SETTINGS))


def main(argv, steps=None):
    del argv
    import_tensorflow(FLAGS.verbosity, command=True)
    from bert_packed.training.pretraining import run_pretraining

    result = run_pretraining(settings_from_flags(), steps, command_flags_text(FLAGS))
    if result.run is None:
        record = result.evaluation
        print(f"{PROGRAM}: evaluated {record['checkpoint']} (step {record['step']}): masked-LM accuracy "
              f"{record.get('mlm_accuracy', 0):.4f}, loss {record.get('loss', 0):.4f} over "
              f"{record.get('num_sequences', 0):,.0f} sequences -> {result.directory.file(EVAL_RESULTS)}")
        return
    exit_if_stopped(PROGRAM, result.run)
    print("\n".join(result.summary))


def entry_point(steps=None):
    """The command; `steps`: a StepPool its caller keeps (bert_packed.training.step_pool)."""
    run(lambda argv: main(argv, steps), PROGRAM, "output_dir",
        "The last complete checkpoint and the logs up to it are kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
