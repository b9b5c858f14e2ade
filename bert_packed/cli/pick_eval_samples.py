r"""Pick the MLPerf eval set: a fixed number of samples, evenly spread, from a file of eval instances.

    python scripts/pick_eval_samples.py --input_tfrecord=runs/eval_intermediate \
        --output_tfrecord=runs/eval_10k --num_examples_to_pick=10000

The reference's pick_eval_samples.py with the same flags and the same choice of records.
"""

from __future__ import annotations

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.pretraining_data.eval_samples import PickSettings, pick_eval_samples
from bert_packed.settings import help_groups

FLAGS = flags.FlagValues()
SETTINGS = (PickSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)
flags.mark_flags_as_required(["input_tfrecord", "output_tfrecord"], flag_values=FLAGS)

PROGRAM = "pick_eval_samples"


def main(argv):
    del argv
    settings = from_flags(FLAGS, PickSettings)
    total = pick_eval_samples(settings)
    print(f"{PROGRAM}: picked {settings.num_examples_to_pick:,} of {total:,} records -> {settings.output_tfrecord}")


def entry_point():
    run(main, PROGRAM, "output_tfrecord", "Nothing was written", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
