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

from bert_packed.cli.common import expand_globs, run
from bert_packed.dataset_info import require_seq_length
from bert_packed.errors import SettingsError
from bert_packed.pretraining_data.corpus import INPUT_FORMATS
from bert_packed.pretraining_data.create_dataset import (
    DatasetSettings,
    create_pretraining_dataset,
    create_pretraining_files,
)
from bert_packed.pretraining_data.instances import MaskingConfig
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE, vocabulary_path

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "Comma-separated input files or globs, text in --input_format.")
flags.DEFINE_enum("input_format", "auto", ["auto", *INPUT_FORMATS],
                  "How the text files hold documents: " + "; ".join(f"{name}: {text}" for name, text in INPUT_FORMATS.items())
                  + "; auto: detected from the first input file's first lines, and said in one line.")
flags.DEFINE_string("text_field", "text", "With --input_format=jsonl: the field of each object that holds its text.")
flags.DEFINE_string("output_dir", None, "Where the TFRecord shards, histogram.json and metadata.json go.")
flags.DEFINE_string("output_file", None, "Instead of --output_dir, as the reference: one TFRecord file (or a "
                                         "comma-separated list, instances dealt round-robin), no metadata.json.")
flags.DEFINE_string("vocab_file", DEFAULT_VOCAB_FILE, "BERT WordPiece vocabulary (the reference has no "
                                                      "default).")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
flags.DEFINE_bool("do_whole_word_mask", False, "Mask whole words instead of WordPieces.")
flags.DEFINE_integer("max_seq_length", 512, "L: tokens per instance, [CLS] and [SEP]s included (reference "
                                            "default 128).")
flags.DEFINE_integer("max_predictions_per_seq", 76, "P: masked-LM predictions per instance at most (reference "
                                                    "default 20).")
flags.DEFINE_integer("random_seed", 12345, "Seed; with the same inputs the output is identical.")
flags.DEFINE_integer("dupe_factor", 10, "Passes over the data, each with different masks.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Share of tokens to predict.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter random target length per document.")
flags.DEFINE_enum("empty_documents", "warn", ["warn", "error"], "What an empty document in the input does.")
flags.DEFINE_float("eval_fraction", 0.0, "Share of each file's documents held out as eval-*.tfrecord.")
flags.DEFINE_integer("num_workers", 0, "Worker processes (0: one per core).")
flags.mark_flags_as_required(["input_file"])

PROGRAM = "create_pretraining_data"


def settings_from_flags() -> DatasetSettings:
    """The flags, checked, as the job's settings (shared with `python -m bert_packed.beam create`).

    Raises:
      SettingsError: a flag out of range, or flags that do not go together.
    """
    require_seq_length(FLAGS.max_seq_length)
    if FLAGS.max_predictions_per_seq > FLAGS.max_seq_length:
        raise SettingsError(f"--max_predictions_per_seq={FLAGS.max_predictions_per_seq}: more than the "
                            f"--max_seq_length={FLAGS.max_seq_length} tokens of an instance")
    if FLAGS.max_predictions_per_seq < 1 or FLAGS.dupe_factor < 1:
        raise SettingsError("--max_predictions_per_seq and --dupe_factor must be at least 1")
    if not 0.0 < FLAGS.masked_lm_prob < 1.0 or not 0.0 <= FLAGS.short_seq_prob <= 1.0:
        raise SettingsError("--masked_lm_prob must be in (0, 1) and --short_seq_prob in [0, 1]")
    if not 0.0 <= FLAGS.eval_fraction < 1.0:
        raise SettingsError(f"--eval_fraction={FLAGS.eval_fraction}: must be in [0, 1)")
    if bool(FLAGS.output_dir) == bool(FLAGS.output_file):
        raise SettingsError("give one of --output_dir (a dataset directory) and --output_file (TFRecord files)")
    if FLAGS.output_file and FLAGS.eval_fraction:
        raise SettingsError("--eval_fraction needs --output_dir: --output_file holds training instances only")
    if FLAGS.random_seed < 0 or FLAGS.num_workers < 0:
        raise SettingsError(f"--random_seed={FLAGS.random_seed} and --num_workers={FLAGS.num_workers} must be >= 0")
    return DatasetSettings(
        vocab_file=vocabulary_path(FLAGS.vocab_file),
        do_lower_case=FLAGS.do_lower_case,
        config=MaskingConfig(FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, FLAGS.masked_lm_prob,
                             FLAGS.short_seq_prob, FLAGS.do_whole_word_mask),
        dupe_factor=FLAGS.dupe_factor,
        seed=FLAGS.random_seed,
        empty_documents=FLAGS.empty_documents,
        eval_fraction=FLAGS.eval_fraction,
        input_format=FLAGS.input_format,
        text_field=FLAGS.text_field,
    )


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
