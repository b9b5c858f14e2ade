r"""Fine-tune BERT to classify (or score) text: google-research/bert's run_classifier.py, packed.

    python run_classifier.py --task_name=mrpc --data_dir=glue/MRPC --vocab_file=vocab.txt \
        --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt \
        --do_train --do_eval --output_dir=runs/mrpc [--input_mode=padded]

The same flags as google-research's (--do_predict writes test_results.tsv), and --input_mode:
packed (the default: several examples a row, planned on the task's own length histogram),
packed_online (packed anew each epoch) or padded (one a row). The run is pre-training's loop:
checkpoints, exact resume after a kill or a signal (the same command again), logs and refusals;
its evaluation reports the task's GLUE scores (docs/finetuning.md).
"""

from __future__ import annotations

import logging

from absl import flags

from bert_packed.cli.common import command_flags_text, exit_if_stopped, run
from bert_packed.cli.settings_flags import define_flags, from_flags, given_flags
from bert_packed.console.tensorflow_loading import import_tensorflow
from bert_packed.settings import first_run_settings, help_groups
from bert_packed.storage.run_directory import EVAL_RESULTS
from bert_packed.training.finetune_settings import HELP_ORDER, ClassifierSettings

FLAGS = flags.FlagValues()
SETTINGS = (ClassifierSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["task_name", "data_dir", "bert_config_file", "output_dir"], flag_values=FLAGS)
_GROUPS = help_groups(*SETTINGS)
HELP_GROUPS = {group: _GROUPS[group] for group in HELP_ORDER}
FIRST_RUN = first_run_settings(*SETTINGS)

PROGRAM = "run_classifier"


def main(argv, steps=None):
    del argv
    import_tensorflow(FLAGS.verbosity, command=True)
    from bert_packed.training.finetune import run_classifier

    settings = from_flags(FLAGS, ClassifierSettings, given=given_flags(FLAGS, *SETTINGS))
    result = run_classifier(settings, steps, command_flags_text(FLAGS))  # every file read and checked first
    if result.run is not None:
        exit_if_stopped(PROGRAM, result.run)
        print(f"{PROGRAM}: trained {result.run.step} updates in {settings.output_dir}"
              + (f": {result.figures}" if result.figures else ""))
    elif result.evaluation:
        record = result.evaluation
        print(f"{PROGRAM}: evaluated {record['checkpoint']} (step {record['step']}): {result.figures} -> "
              f"{result.directory.file(EVAL_RESULTS)}")
    if result.predictions:
        print(f"{PROGRAM}: predicted the {result.num_predictions:,} examples of the test file -> "
              f"{result.predictions}")
    if result.at_chance:
        logging.warning(result.at_chance)


def entry_point(steps=None):
    """The command; `steps`: a StepPool its caller keeps (bert_packed.training.step_pool)."""
    run(lambda argv: main(argv, steps), PROGRAM, "output_dir",
        "The last complete checkpoint and the logs up to it are kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
