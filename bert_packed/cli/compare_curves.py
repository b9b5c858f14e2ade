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

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags, given_flags
from bert_packed.reports.comparison import CompareSettings, compare_curves
from bert_packed.settings import help_groups

FLAGS = flags.FlagValues()
SETTINGS = (CompareSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "compare_curves"


def main(argv) -> None:
    settings = from_flags(FLAGS, CompareSettings, runs=tuple(argv[1:]), given=given_flags(FLAGS, *SETTINGS))
    print("\n".join(compare_curves(settings).lines))


def entry_point():
    run(main, PROGRAM, "output", "The runs are untouched", positional=True, flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
