r"""Pack unpacked BERT pre-training TFRecords into packed TFRecords, losslessly.

    python scripts/pack_pretraining_data.py --input_files='runs/data/unpacked/part-*.tfrecord' \
        --output_dir=runs/data/packed --max_seq_length=512 --max_predictions_per_seq=76 \
        --max_sequences_per_pack=3 --algorithm=lp --verify

Writes packed-NNNNN-of-NNNNN.tfrecord shards, histogram.json and metadata.json. An interrupted
run resumes from where it stopped when started again with the same flags.
"""

from __future__ import annotations

import logging

from absl import flags

from bert_packed.cli.common import expand_globs, run
from bert_packed.dataset_info import require_seq_length, shapes_given_or_recorded
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.packing import ALGORITHMS, DEFAULT_ALGORITHM
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset, verify_packed_dataset

FLAGS = flags.FLAGS
flags.DEFINE_string("input_files", None, "Comma-separated globs of unpacked TFRecord files.")
flags.DEFINE_string("output_dir", None, "Where the packed shards, histogram.json and metadata.json go.")
flags.DEFINE_integer("max_seq_length", 512, "L of the input records and of the packs (default: as the inputs' "
                                            "metadata.json records, else 512).")
flags.DEFINE_integer("max_predictions_per_seq", 76, "P of the input records; packs hold P + S (default: as "
                                                    "metadata.json records, else 76).")
flags.DEFINE_integer("max_sequences_per_pack", 3, "S: at most this many sequences share a pack.")
flags.DEFINE_enum("algorithm", DEFAULT_ALGORITHM, list(ALGORITHMS), "Packing algorithm (see python -m bert_packed.packing).")
flags.DEFINE_integer("seed", PackSettings.seed, "Decides which sequences share a pack and the order of the packs.")
flags.DEFINE_integer("num_shards", PackSettings.num_shards, "Output files at least (more when the data is large).")
flags.DEFINE_integer("bucket_mb", PackSettings.bucket_bytes >> 20, "Memory for one bucket of sequences in the writing pass.")
flags.DEFINE_integer("num_workers", 0, "Threads for every pass and for --verify (0: one per core).")
flags.DEFINE_bool("verify", False, "Re-read the output and decode every pack back into its sequences.")
flags.mark_flags_as_required(["input_files", "output_dir"])

PROGRAM = "pack_pretraining_data"


def settings_from_flags(files: list[str]) -> PackSettings:
    """The flags, checked, as the job's settings (shared with `python -m bert_packed.beam pack`):
    L and P as given, else as the inputs' metadata.json records.

    Raises:
      SettingsError: a flag out of range, or L or P other than the inputs'.
    """
    max_seq_length, max_predictions_per_seq = shapes_given_or_recorded(
        files, *(FLAGS[name].value if FLAGS[name].present else None for name in ("max_seq_length",
                                                                                 "max_predictions_per_seq")),
        defaults=(FLAGS["max_seq_length"].default, FLAGS["max_predictions_per_seq"].default))
    if FLAGS.max_sequences_per_pack < 1 or max_predictions_per_seq < 1:
        raise SettingsError("--max_sequences_per_pack and --max_predictions_per_seq must be >= 1")
    require_seq_length(max_seq_length)
    if FLAGS.num_shards < 1 or FLAGS.bucket_mb < 1:
        raise SettingsError("--num_shards and --bucket_mb must be >= 1")
    if FLAGS.seed < 0 or FLAGS.num_workers < 0:
        raise SettingsError(f"--seed={FLAGS.seed} and --num_workers={FLAGS.num_workers} must be >= 0")
    return PackSettings(
        shapes=Shapes(max_seq_length, max_predictions_per_seq, FLAGS.max_sequences_per_pack),
        algorithm=FLAGS.algorithm, seed=FLAGS.seed, num_shards=FLAGS.num_shards,
        bucket_bytes=FLAGS.bucket_mb << 20)


def main(argv):
    del argv
    files = expand_globs(FLAGS.input_files, "--input_files")
    settings = settings_from_flags(files)
    metadata = pack_pretraining_dataset(files, FLAGS.output_dir, settings, FLAGS.num_workers)
    report(PROGRAM, metadata, FLAGS.output_dir)


def report(program: str, metadata: dict, where: str) -> None:
    """--verify's check of what was written, then the command's last line: what it made, and where."""
    if FLAGS.verify:
        found = verify_packed_dataset(where, FLAGS.num_workers)
        logging.debug("verified: %d packs decode to the %d input sequences (checksum %s)",
                      found["num_packs"], found["num_sequences"], found["checksum"])
    print(f"{program}: {metadata['num_sequences']:,} sequences in {metadata['num_records']:,} packs (packing factor "
          f"{metadata['packing_factor']:.3f}, {metadata.get('efficiency', 0.0):.2%} of the slots filled, "
          f"{metadata.get('algorithm')} at depth {metadata['max_sequences_per_pack']})"
          + (", verified" if FLAGS.verify else "") + f" -> {where}")


def entry_point():
    run(main, PROGRAM, "output_dir", "Finished passes and shards are kept")


if __name__ == "__main__":
    entry_point()
