r"""Pack unpacked BERT pre-training TFRecords into packed TFRecords, losslessly.

    python scripts/pack_pretraining_data.py --input_files='runs/data/unpacked/part-*.tfrecord' \
        --output_dir=runs/data/packed --max_seq_length=512 --max_predictions_per_seq=76 \
        --max_sequences_per_pack=3 --algorithm=lp --verify

Writes packed-NNNNN-of-NNNNN.tfrecord shards, histogram.json and metadata.json. An interrupted
run resumes from where it stopped when started again with the same flags.
"""

from __future__ import annotations

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags, given_flags
from bert_packed.packing.pack_dataset import pack_pretraining_data
from bert_packed.packing.pack_settings import PackCommandSettings
from bert_packed.settings import help_groups

FLAGS = flags.FlagValues()
SETTINGS = (PackCommandSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
flags.mark_flags_as_required(["input_files", "output_dir"], flag_values=FLAGS)
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "pack_pretraining_data"


def settings_from_flags() -> PackCommandSettings:
    """The flags, checked, as the command's settings (shared with `python -m bert_packed.beam
    pack`, which takes the job's from them: PackCommandSettings.pack_settings).

    Raises:
      SettingsError: a flag out of range.
    """
    return from_flags(FLAGS, PackCommandSettings, given=given_flags(FLAGS, *SETTINGS))


def main(argv):
    del argv
    metadata = pack_pretraining_data(settings_from_flags())
    report(PROGRAM, metadata, FLAGS.output_dir)


def report(program: str, metadata: dict, where: str) -> None:
    """The command's last line: what it made, and where (verified, with --verify)."""
    print(f"{program}: {metadata['num_sequences']:,} sequences in {metadata['num_records']:,} packs (packing factor "
          f"{metadata['packing_factor']:.3f}, {metadata.get('efficiency', 0.0):.2%} of the slots filled, "
          f"{metadata.get('algorithm')} at depth {metadata['max_sequences_per_pack']})"
          + (", verified" if FLAGS.verify else "") + f" -> {where}")


def entry_point():
    run(main, PROGRAM, "output_dir", "Finished passes and shards are kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
