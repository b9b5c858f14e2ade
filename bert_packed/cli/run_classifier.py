r"""Fine-tune BERT to classify (or score) text: google-research/bert's run_classifier.py, packed.

    python run_classifier.py --task_name=mrpc --data_dir=glue/MRPC --vocab_file=vocab.txt \
        --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt \
        --do_train --do_eval --output_dir=runs/mrpc [--input_mode=padded]

The same flags as google-research's, and --input_mode: packed (the default: several examples a
row, planned on the task's own length histogram), packed_online (packed anew each epoch) or
padded (one a row). The run is pre-training's loop: checkpoints, exact resume after a kill or a
signal (the same command again), logs and refusals; its evaluation reports the task's GLUE scores (docs/finetuning.md).
"""

from __future__ import annotations

import logging

from absl import flags

from bert_packed.cli.common import command_flags_text, exit_if_stopped, run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.curves import at_chance_warning
from bert_packed.finetuning.settings import ClassifierSettings
from bert_packed.run_directory import EVAL_LOG, EVAL_RESULTS, RunDirectory
from bert_packed.settings import first_run_settings, help_groups
from bert_packed.tensorflow_loading import import_tensorflow

FLAGS = flags.FLAGS
SETTINGS = (ClassifierSettings,)
define_flags(*SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["task_name", "data_dir", "bert_config_file", "output_dir"])
HELP_GROUPS = help_groups(*SETTINGS)
FIRST_RUN = first_run_settings(*SETTINGS)

PROGRAM = "run_classifier"


def main(argv):
    del argv
    import_tensorflow(FLAGS.verbosity)
    from bert_packed.training.distribution import leave_together
    from bert_packed.training.finetune import classifier_run
    from bert_packed.training.loop import evaluate_only, train_and_evaluate
    from bert_packed.training.process import set_up_process
    from bert_packed.training.step import shared_step

    settings = from_flags(ClassifierSettings)
    fine_tuning = classifier_run(settings, command_flags_text())  # every file read and checked first
    config = fine_tuning.config
    set_up_process(config)
    step = shared_step(config, fine_tuning.train_data, objective=fine_tuning.objective)
    if not settings.do_train:
        record = evaluate_only(config, fine_tuning.eval_data, step)
        print(f"{PROGRAM}: evaluated {record['checkpoint']} (step {record['step']}): "
              f"{step.objective.describe(record)} -> {RunDirectory(config.run.output_dir).file(EVAL_RESULTS)}")
        return
    result = train_and_evaluate(config, fine_tuning.train_data, fine_tuning.eval_data, step)
    leave_together(step.strategy)
    exit_if_stopped(PROGRAM, result)
    last_eval = result.directory.read_log(EVAL_LOG)[-1:] if settings.do_eval else []
    figures = f": {step.objective.describe(last_eval[0])}" if last_eval else ""
    print(f"{PROGRAM}: trained {result.step} updates in {config.run.output_dir}{figures}")
    if last_eval and at_chance_warning(result.directory):
        logging.warning(at_chance_warning(result.directory))


def entry_point():
    run(main, PROGRAM, "output_dir", "The last complete checkpoint and the logs up to it are kept")


if __name__ == "__main__":
    entry_point()
