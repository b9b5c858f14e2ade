r"""Compare training runs: accuracy and loss curves (PNG) and a summary table.

    python scripts/compare_curves.py runs/wikipedia_like/unpacked_seed1 runs/wikipedia_like/packed_batch_corrected_seed1 \
        --output runs/wikipedia_like/two_runs.png --accuracy auto

The positional arguments are run_pretraining.py output directories; the first configuration is
the baseline for the speed-ups. Directories named alike but for a trailing seed
("packed_seed1", "packed_seed2") are one configuration: its seeds' mean and range. With
--throughput, the speed-ups measured alternately by scripts/benchmark_training.py (fine-tuning
runs: benchmark_finetuning.py) are quoted under the table. Exit status 2 with one line on bad input.
"""

from __future__ import annotations

import logging
import os

from absl import flags

from bert_packed import files
from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.curves import (
    CompareSettings,
    at_sequences_table,
    automatic_accuracy,
    clock_note,
    format_table,
    load_run,
    metric_of,
    plot,
    runs_have,
    summary_table,
    target_note,
    throughput_lines,
    verdict_notes,
)
from bert_packed.errors import SettingsError
from bert_packed.settings import help_groups

FLAGS = flags.FLAGS
SETTINGS = (CompareSettings,)
define_flags(*SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "compare_curves"


def main(argv) -> None:
    from_flags(CompareSettings)
    directories = argv[1:]
    if not directories:
        raise SettingsError("expected one or more run directories (run_pretraining.py --output_dir)")
    labels = FLAGS.labels or [None] * len(directories)
    if len(labels) != len(directories):
        raise SettingsError(f"--labels has {len(labels)} names for {len(directories)} runs")
    runs = [load_run(directory, label) for directory, label in zip(directories, labels)]
    without = [run.name for run in runs if run.info.get("nsp_loss") is False]
    if without and len(without) < len(runs):
        logging.warning("%s trained without the NSP loss (--nsp_loss=false), the others with it: their losses differ "
                        "by the NSP term; compare MLM accuracy (the MLPerf metric)", ", ".join(without))
    metric = metric_of(runs)
    # MLPerf's 0.720 is a target of MLM accuracy only: fine-tuning runs take 'auto' unless given one.
    automatic = FLAGS.accuracy == "auto" or (metric != "mlm_accuracy" and not FLAGS["accuracy"].present)
    unevaluated = [run.name for run in runs if not run.evals]
    if FLAGS.accuracy == "auto" and unevaluated:
        raise SettingsError(f"--accuracy auto: {runs_have(unevaluated)} no evaluations (eval_log.jsonl), whose curves "
                            f"it picks a target from; give --accuracy=NUMBER")
    if automatic:
        accuracy = None if unevaluated else automatic_accuracy(runs)  # none: the note says why
    else:
        accuracy = float(FLAGS.accuracy)
    with files.exclusive(f"{FLAGS.output}.lock", "compare_curves"):
        files.remove_leftovers(os.path.dirname(FLAGS.output) or ".", of=os.path.basename(FLAGS.output))
        plot(runs, FLAGS.output)
    rows = summary_table(runs, accuracy)
    print(format_table(rows, accuracy))
    print("\n" + "\n".join([target_note(runs, rows, accuracy, automatic), clock_note(metric),
                             *verdict_notes(rows)]))
    if FLAGS.throughput:
        for line in throughput_lines(FLAGS.throughput, metric):
            print(line)
    if FLAGS.at_sequences:
        print(f"\n{at_sequences_table(runs, FLAGS.at_sequences)}")
    print(f"\ncurves: {FLAGS.output}")


def entry_point():
    run(main, PROGRAM, "output", "The runs are untouched", positional=True)


if __name__ == "__main__":
    entry_point()
