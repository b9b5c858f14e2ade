r"""Pick the MLPerf eval set: a fixed number of samples, evenly spread, from a file of eval instances.

    python scripts/pick_eval_samples.py --input_tfrecord=runs/eval_intermediate \
        --output_tfrecord=runs/eval_10k --num_examples_to_pick=10000

The reference's pick_eval_samples.py with the same flags and the same choice of records.
"""

from __future__ import annotations

import os

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.pretraining_data.eval_samples import PickSettings, pick_eval_samples
from bert_packed.settings import help_groups
from bert_packed.storage import files
from bert_packed.training.provenance import origins

FLAGS = flags.FLAGS
SETTINGS = (PickSettings,)
define_flags(*SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)
flags.mark_flags_as_required(["input_tfrecord", "output_tfrecord"])

PROGRAM = "pick_eval_samples"


def main(argv):
    del argv
    from_flags(PickSettings)
    # The output is one file with no metadata.json, so no later command can tell where its records
    # came from: a training shard is refused here (MLPerf never evaluates on what it trains on).
    trained = next((o.file for o in origins([FLAGS.input_tfrecord])[FLAGS.input_tfrecord] if not o.held_out), None)
    if trained is not None:
        raise SettingsError(f"--input_tfrecord={FLAGS.input_tfrecord}: a training shard of {os.path.dirname(trained)} "
                            f"(its metadata.json): its records are trained on; pick from its held-out files "
                            f"(eval-*.tfrecord) or from records of held-out text")
    # The output is a file of its own: never the input, nor a file of a described dataset.
    if files.absolute(FLAGS.output_tfrecord) == files.absolute(FLAGS.input_tfrecord):
        raise SettingsError(f"--output_tfrecord={FLAGS.output_tfrecord}: the input itself; write the picked records "
                            f"to a file of their own")
    if read_dataset_info(os.path.dirname(files.absolute(FLAGS.output_tfrecord))) is not None:
        raise SettingsError(f"--output_tfrecord={FLAGS.output_tfrecord}: in a dataset's directory (its "
                            f"metadata.json describes it); write the picked records elsewhere")
    total = pick_eval_samples(FLAGS.input_tfrecord, FLAGS.output_tfrecord, FLAGS.num_examples_to_pick,
                              Shapes(FLAGS.max_seq_length, FLAGS.max_predictions_per_seq))
    print(f"{PROGRAM}: picked {FLAGS.num_examples_to_pick:,} of {total:,} records -> {FLAGS.output_tfrecord}")


def entry_point():
    run(main, PROGRAM, "output_tfrecord", "Nothing was written")


if __name__ == "__main__":
    entry_point()
