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

import json
import os
import re

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.errors import SettingsError, raise_if_retryable
from bert_packed.inputs.input_files import expand_globs
from bert_packed.pretraining_data.vocabulary import VocabularySettings, build_vocabulary, reserved_tokens
from bert_packed.settings import help_groups
from bert_packed.storage import files

FLAGS = flags.FLAGS
SETTINGS = (VocabularySettings,)
define_flags(*SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)

PROGRAM = "build_vocabulary"


def main(argv) -> None:
    del argv
    settings = from_flags(VocabularySettings)
    paths = expand_globs(settings.input_file, "--input_file")
    template = _bert_config(settings.bert_config_file) if settings.bert_config_file else None  # refused before the work
    config_path = (settings.output_bert_config_file or os.path.join(os.path.dirname(settings.vocab_file),
                                                                    "bert_config.json")) if template else None
    _refuse_writing_over_inputs(settings, paths, config_path)
    replaced = {path for path in (settings.vocab_file, config_path) if path and files.exists(path)}
    tokens = build_vocabulary(paths, settings.vocab_size, settings.do_lower_case, settings.input_format,
                              settings.text_field, settings.min_frequency)
    files.makedirs(os.path.dirname(settings.vocab_file) or ".")
    files.write_text_atomically(settings.vocab_file, "".join(f"{token}\n" for token in tokens))
    learned = sum(not re.fullmatch(r"\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]", token) for token in tokens)
    print(f"{PROGRAM}: {len(tokens):,} tokens, {learned:,} learned from {len(paths):,} file"
          f"{'' if len(paths) == 1 else 's'} ({'uncased' if settings.do_lower_case else 'cased'}; "
          f"{len(reserved_tokens())} reserved as google-research's) -> {settings.vocab_file}"
          + (" (the vocabulary there replaced)" if settings.vocab_file in replaced else ""))
    if template is not None:
        files.write_text_atomically(config_path, json.dumps({**template, "vocab_size": len(tokens)}, indent=2) + "\n")
        print(f"{PROGRAM}: {settings.bert_config_file} with vocab_size {len(tokens):,} -> {config_path}"
              + (" (the config there replaced)" if config_path in replaced else ""))


def _refuse_writing_over_inputs(settings: VocabularySettings, inputs: list[str], config_path: str | None) -> None:
    """Refuses an output that is one of the inputs (a corpus file, the template config) or the other output."""
    read = {files.absolute(path): flag for path, flag in [*((p, "--input_file") for p in inputs),
                                                          (settings.bert_config_file, "--bert_config_file")] if path}
    written = [(settings.vocab_file, "--vocab_file"), (config_path, "--output_bert_config_file")]
    for path, flag in written:
        if path and files.absolute(path) in read:
            raise SettingsError(f"{flag}={path}: one of the files it is made from ({read[files.absolute(path)]}); "
                                f"give another path")
    if config_path and files.absolute(config_path) == files.absolute(settings.vocab_file):
        raise SettingsError(f"--output_bert_config_file={config_path}: the vocabulary's path too; give another")


def _bert_config(path: str) -> dict:
    """A google-research bert_config.json, as a dict."""
    try:
        config = files.read_json_object(path)
    except (OSError, ValueError) as e:
        raise_if_retryable(e)
        raise SettingsError(f"--bert_config_file={path}: cannot read it as a BERT config ({e})") from None
    if "vocab_size" not in config or "hidden_size" not in config:
        raise SettingsError(f"--bert_config_file={path}: not a BERT config (no vocab_size and hidden_size)")
    return config


def entry_point():
    run(main, PROGRAM, ("vocab_file", "output_bert_config_file"), "Nothing is kept until the vocabulary is written")


if __name__ == "__main__":
    entry_point()
