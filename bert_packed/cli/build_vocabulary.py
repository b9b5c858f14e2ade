r"""Build a WordPiece vocabulary for a corpus, in google-research/bert's layout, and the BERT
config that goes with it.

    python -m bert_packed.vocab --input_file='corpus/*.jsonl.gz' --vocab_file=runs/mine/vocab.txt \
        --vocab_size=16000 --bert_config_file=configs/bert_config_tiny.json
    bert-packed-vocab --input_file='data/wikipedia_sample/wiki_*' --vocab_file=vocab.txt --nodo_lower_case

The corpus is read as create_pretraining_data reads it (--input_format, compressed files too);
give the vocabulary to create_pretraining_data and run_pretraining as --vocab_file, and the
written config as --bert_config_file.
"""

from __future__ import annotations

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.pretraining_data.vocabulary import VocabularySettings, reserved_tokens, write_vocabulary
from bert_packed.settings import help_groups

FLAGS = flags.FlagValues()
SETTINGS = (VocabularySettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "build_vocabulary"


def main(argv) -> None:
    del argv
    settings = from_flags(FLAGS, VocabularySettings)
    written = write_vocabulary(settings)
    files_read = f"{written.num_input_files:,} file{'' if written.num_input_files == 1 else 's'}"
    print(f"{PROGRAM}: {written.num_tokens:,} tokens, {written.num_learned:,} learned from {files_read} "
          f"({'uncased' if settings.do_lower_case else 'cased'}; {len(reserved_tokens())} reserved as "
          f"google-research's) -> {written.vocab_file}"
          + (" (the vocabulary there replaced)" if written.vocab_file in written.replaced else ""))
    if written.config_file is not None:
        print(f"{PROGRAM}: {settings.bert_config_file} with vocab_size {written.num_tokens:,} -> {written.config_file}"
              + (" (the config there replaced)" if written.config_file in written.replaced else ""))


def entry_point():
    run(main, PROGRAM, ("vocab_file", "output_bert_config_file"), "Nothing is kept until the vocabulary is written",
        flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
