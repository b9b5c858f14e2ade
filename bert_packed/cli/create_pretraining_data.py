r"""Create unpacked BERT pre-training TFRecords from text: WikiExtractor output, one sentence a
line, one document a line, or JSON lines (--input_format).

    python scripts/create_pretraining_data.py --input_file='data/wikipedia_sample/*' \
        --output_dir=runs/data/unpacked --vocab_file=data/bert_uncased_vocab.txt \
        --max_seq_length=512 --max_predictions_per_seq=76 --dupe_factor=10

Flag names and defaults follow the MLPerf reference script (output_dir replaces output_file:
one shard per input file, plus histogram.json and metadata.json).
"""

from __future__ import annotations

import os

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.inputs.dataset_info import HISTOGRAM_FILE
from bert_packed.packing import load_histogram, plan
from bert_packed.packing.pack_settings import PackCommandSettings
from bert_packed.packing.plan import DEFAULT_ALGORITHM
from bert_packed.pretraining_data.create_command import CreateSettings, create_pretraining_data
from bert_packed.pretraining_data.create_dataset import DatasetSettings
from bert_packed.settings import help_groups
from bert_packed.storage import files

FLAGS = flags.FlagValues()
SETTINGS = (CreateSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["input_file"], flag_values=FLAGS)
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "create_pretraining_data"


def settings_from_flags() -> DatasetSettings:
    """The flags, checked, as the job's settings (shared with `python -m bert_packed.beam create`).

    Raises:
      SettingsError: a flag out of range, or flags that do not go together.
    """
    return from_flags(FLAGS, CreateSettings).dataset_settings()


def main(argv):
    del argv
    metadata = create_pretraining_data(from_flags(FLAGS, CreateSettings))
    report(PROGRAM, metadata, FLAGS.output_dir or FLAGS.output_file)


def report(program: str, metadata: dict, where: str) -> None:
    """The command's last lines: what it made, and where; then, for an output directory, whether
    packing is worth it for these records (packing_answer)."""
    held_out = metadata.get("num_eval_instances", 0)
    documents = metadata.get("num_documents", 0)
    print(f"{program}: {metadata['num_sequences']:,} training instances from {documents:,} "
          f"document{'' if documents == 1 else 's'} ({metadata.get('padding_fraction', 0.0):.1%} padding at "
          f"L={metadata['max_seq_length']})"
          + (f", {held_out:,} held out for evaluation" if held_out else "") + f" -> {where}")
    histogram = os.path.join(where, HISTOGRAM_FILE)
    if FLAGS.output_dir and files.exists(histogram):
        print(f"{program}: {packing_answer(load_histogram(histogram), metadata['max_seq_length'])}")


def packing_answer(histogram, max_seq_length: int) -> str:
    """The planner's answer at the records' L and pack_pretraining_data's default depth and
    algorithm: the packing factor, and the speed-up it bounds (a pack costs what a row costs)."""
    depth = PackCommandSettings.max_sequences_per_pack
    factor = plan(histogram, max_seq_length, DEFAULT_ALGORITHM, depth).packing_factor
    little = "; little to gain" if factor < 1.25 else ""
    return (f"packed ({DEFAULT_ALGORITHM}, up to {depth} sequences a pack), these records are {factor:.2f} sequences "
            f"a pack: training packed is at most {factor:.2f}x as fast in sequences a second{little} "
            f"(docs/packing.md: what corpora gain)")


def entry_point():
    run(main, PROGRAM, ("output_dir", "output_file"), "Finished shards are kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
