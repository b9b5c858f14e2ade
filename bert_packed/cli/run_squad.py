r"""Fine-tune BERT to answer questions on a text: google-research/bert's run_squad.py, packed.

    python run_squad.py --vocab_file=vocab.txt --bert_config_file=bert_config.json \
        --init_checkpoint=bert_model.ckpt --do_train --train_file=squad/train-v1.1.json \
        --do_predict --predict_file=squad/dev-v1.1.json --output_dir=runs/squad [--input_mode=padded]

The same flags as google-research's (SQuAD v1.1), and --input_mode: packed (the default: several
windows a row, planned on the windows' own length histogram), packed_online (packed anew each
epoch) or padded (one a row). The run is pre-training's loop: checkpoints, exact resume after a
kill or a signal (the same command again), logs and refusals. --do_predict writes
predictions.json and nbest_predictions.json in --output_dir and, where the predict file holds
answers, reports the official exact match and F1 (docs/finetuning.md).
"""

from __future__ import annotations

import logging

from absl import flags

from bert_packed.cli.common import command_flags_text, exit_if_stopped, run
from bert_packed.cli.settings_flags import define_flags, from_flags, given_flags
from bert_packed.console.tensorflow_loading import import_tensorflow
from bert_packed.settings import first_run_settings, help_groups
from bert_packed.training.finetune_settings import HELP_ORDER, SquadSettings

FLAGS = flags.FlagValues()
SETTINGS = (SquadSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["bert_config_file", "output_dir"], flag_values=FLAGS)
_GROUPS = help_groups(*SETTINGS)
HELP_GROUPS = {group: _GROUPS[group] for group in HELP_ORDER}
FIRST_RUN = first_run_settings(*SETTINGS)

PROGRAM = "run_squad"


def main(argv, steps=None):
    del argv
    import_tensorflow(FLAGS.verbosity, command=True)
    from bert_packed.training.finetune import run_squad

    settings = from_flags(FLAGS, SquadSettings, given=given_flags(FLAGS, *SETTINGS))
    result = run_squad(settings, steps, command_flags_text(FLAGS))  # every file read and checked first
    if result.run is not None:
        exit_if_stopped(PROGRAM, result.run)
        print(f"{PROGRAM}: trained {result.run.step} updates in {settings.output_dir}")
    if result.predictions:
        print(f"{PROGRAM}: answered {result.num_predictions:,} questions of {settings.predict_file}: "
              f"{result.figures} -> {result.predictions}")
    if result.at_chance:
        logging.warning(result.at_chance)


def entry_point(steps=None):
    """The command; `steps`: a StepPool its caller keeps (bert_packed.training.step_pool)."""
    run(lambda argv: main(argv, steps), PROGRAM, "output_dir",
        "The last complete checkpoint and the logs up to it are kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
