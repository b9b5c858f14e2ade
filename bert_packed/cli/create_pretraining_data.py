r"""Create unpacked BERT pre-training TFRecords from text: WikiExtractor output, one sentence a
line, one document a line, or JSON lines (--input_format).

    python scripts/create_pretraining_data.py --input_file='data/wikipedia_sample/*' \
        --output_dir=runs/data/unpacked --vocab_file=data/bert_uncased_vocab.txt \
        --max_seq_length=512 --max_predictions_per_seq=76 --dupe_factor=10

Flag names and defaults follow the MLPerf reference script (output_dir replaces output_file:
one shard per input file, plus histogram.json and metadata.json).
"""

from __future__ import annotations

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.input_files import expand_globs
from bert_packed.pretraining_data.create_dataset import (
    CreateSettings,
    DatasetSettings,
    create_pretraining_dataset,
    create_pretraining_files,
)
from bert_packed.settings import help_groups

FLAGS = flags.FLAGS
SETTINGS = (CreateSettings,)
define_flags(*SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["input_file"])
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "create_pretraining_data"


def settings_from_flags() -> DatasetSettings:
    """The flags, checked, as the job's settings (shared with `python -m bert_packed.beam create`).

    Raises:
      SettingsError: a flag out of range, or flags that do not go together.
    """
    return from_flags(CreateSettings).dataset_settings()


def main(argv):
    del argv
    settings = settings_from_flags()
    files = expand_globs(FLAGS.input_file, "--input_file")
    if FLAGS.output_file:
        outputs = [path.strip() for path in FLAGS.output_file.split(",") if path.strip()]
        metadata = create_pretraining_files(files, outputs, settings, FLAGS.num_workers)
    else:
        metadata = create_pretraining_dataset(files, FLAGS.output_dir, settings, FLAGS.num_workers)
    report(PROGRAM, metadata, FLAGS.output_dir or FLAGS.output_file)


def report(program: str, metadata: dict, where: str) -> None:
    """The command's last line: what it made, and where."""
    held_out = metadata.get("num_eval_instances", 0)
    documents = metadata.get("num_documents", 0)
    print(f"{program}: {metadata['num_sequences']:,} training instances from {documents:,} "
          f"document{'' if documents == 1 else 's'} ({metadata.get('padding_fraction', 0.0):.1%} padding at "
          f"L={metadata['max_seq_length']})"
          + (f", {held_out:,} held out for evaluation" if held_out else "") + f" -> {where}")


def entry_point():
    run(main, PROGRAM, ("output_dir", "output_file"), "Finished shards are kept")


if __name__ == "__main__":
    entry_point()
