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
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.curves import at_chance_warning
from bert_packed.finetuning.settings import SquadSettings
from bert_packed.run_directory import EVAL_LOG, PREDICTIONS, RunDirectory
from bert_packed.settings import first_run_settings, help_groups
from bert_packed.tensorflow_loading import import_tensorflow

FLAGS = flags.FLAGS
SETTINGS = (SquadSettings,)
define_flags(*SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["bert_config_file", "output_dir"])
HELP_GROUPS = help_groups(*SETTINGS)
FIRST_RUN = first_run_settings(*SETTINGS)

PROGRAM = "run_squad"


def main(argv):
    del argv
    import_tensorflow(FLAGS.verbosity)
    from bert_packed.training.distribution import chief, leave_together
    from bert_packed.training.finetune import squad_run
    from bert_packed.training.loop import evaluate_only, train_and_evaluate
    from bert_packed.training.process import set_up_process
    from bert_packed.training.step import shared_step

    settings = from_flags(SquadSettings)
    fine_tuning = squad_run(settings, command_flags_text())  # every file read and checked first
    config = fine_tuning.config
    set_up_process(config)
    step = shared_step(config, fine_tuning.train_data, objective=fine_tuning.objective)
    directory = RunDirectory(config.run.output_dir)
    if settings.do_train:
        result = train_and_evaluate(config, fine_tuning.train_data, fine_tuning.eval_data, step)
        leave_together(step.strategy)
        exit_if_stopped(PROGRAM, result)
        print(f"{PROGRAM}: trained {result.step} updates in {config.run.output_dir}")
    if not settings.do_predict:
        return
    if step.objective.answers is None:  # no evaluation at the end of this command's training: predict now
        record = evaluate_only(config, fine_tuning.eval_data, step)
    else:
        record = directory.read_log(EVAL_LOG)[-1]
    if chief(step.strategy)[0]:
        directory.write_predictions(*step.objective.answers)
    print(f"{PROGRAM}: answered {len(step.objective.answers[0]):,} questions of {settings.predict_file}: "
          f"{step.objective.describe(record)} -> {directory.file(PREDICTIONS)}")
    if settings.do_train and at_chance_warning(directory):
        logging.warning(at_chance_warning(directory))


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
