"""A WordPiece vocabulary for a corpus, in google-research/bert's layout.

BERT's published vocabularies begin with [PAD], then [unused0] to [unused98] (ids a user may give
to tokens of their own without resizing the model), [UNK], [CLS], [SEP] and [MASK]; the learned
pieces follow, a piece that continues a word spelled with `##`. build_vocabulary learns the
pieces of a corpus (any input format create_pretraining_data reads) with the Hugging Face
`tokenizers` WordPiece trainer, normalised as the Tokenizer that will read them (lower-cased and
accents stripped for an uncased vocabulary), and lays them out that way, its size a multiple of
8 (tensor cores compute the output layer in tiles of 8): more [unused] tokens at the end where
the pieces fall short. The same corpus gives the same vocabulary, whenever it is built.

write_vocabulary is the command as a function of its settings (`python -m bert_packed.vocab`):

    from bert_packed.pretraining_data.vocabulary import VocabularySettings, write_vocabulary

    written = write_vocabulary(VocabularySettings(input_file="data/wikipedia_sample/wiki_*", vocab_file="runs/v/vocab.txt",
                                                  vocab_size=8000, bert_config_file="configs/bert_config_tiny.json"))
    written.num_tokens, written.config_file   # at most 8000 (a multiple of 8), 'runs/v/bert_config.json'
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import re
import string
import unicodedata

from bert_packed.errors import SettingsError, raise_if_retryable
from bert_packed.inputs.file_identity import DataChangedError, FileIdentity
from bert_packed.inputs.input_files import expand_globs
from bert_packed.pretraining_data.corpus import INPUT_FORMATS, CorpusError, detect_corpus_format, iter_documents
from bert_packed.pretraining_data.create_command import CorpusSettings
from bert_packed.pretraining_data.tokenization import SPECIAL_TOKENS
from bert_packed.settings import check_settings, setting
from bert_packed.storage import files
from bert_packed.storage.output_job import EXPORTED_MODEL, found_output

# google-research/bert's: [PAD], [unused0]-[unused98], then [UNK], [CLS], [SEP], [MASK].
UNUSED_AT_THE_START = 99
# Characters kept as single pieces at most (the rest of a corpus's alphabet becomes [UNK]):
# google-research's uncased vocabulary holds about a thousand.
ALPHABET = 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabularySettings(CorpusSettings):
    """The vocabulary builder's settings (the corpus as create_pretraining_data reads it), checked
    when built."""

    vocab_file: str | None = setting(None, "Where the vocabulary goes, one token a line (a BERT vocab.txt).",
                                     group="output")
    vocab_size: int = setting(30_528, "Tokens at most, the reserved ones included, rounded up to a multiple of 8 "
                                      "(google-research's uncased vocabulary: 30,522).", group="vocabulary")
    min_frequency: int = setting(2, "A piece seen fewer times in the corpus is not learned.", group="vocabulary")
    bert_config_file: str | None = setting(None, "A google-research bert_config.json to write again with the "
                                                 "vocabulary's vocab_size, as --output_bert_config_file.",
                                           group="output")
    output_bert_config_file: str | None = setting(None, "Where that config goes (default: bert_config.json beside "
                                                        "--vocab_file).", group="output")

    def __post_init__(self):
        check_settings(self)
        if not self.input_file or not self.vocab_file:
            raise SettingsError("--input_file and --vocab_file are required: the corpus, and where the vocabulary goes")
        if self.vocab_size < len(reserved_tokens()) + 8:
            raise SettingsError(f"--vocab_size={self.vocab_size}: must be at least {len(reserved_tokens()) + 8} (the "
                                f"reserved tokens and some pieces)")
        if self.min_frequency < 1:
            raise SettingsError(f"--min_frequency={self.min_frequency}: must be at least 1")


@dataclasses.dataclass(frozen=True)
class WrittenVocabulary:
    """What write_vocabulary wrote.

    Attributes:
      vocab_file: the vocabulary's path.
      num_tokens: its tokens, the reserved ones included (a multiple of 8).
      num_learned: the pieces learned from the corpus (neither reserved nor [unused]).
      num_input_files: the corpus's files.
      config_file: the BERT config written with the vocabulary's vocab_size (None: none asked for).
      replaced: the paths of those two that held a file before, now replaced.
    """

    vocab_file: str
    num_tokens: int
    num_learned: int
    num_input_files: int
    config_file: str | None = None
    replaced: frozenset[str] = frozenset()


def write_vocabulary(settings: VocabularySettings) -> WrittenVocabulary:
    """Learns the corpus's vocabulary (build_vocabulary) and writes it, each file atomically, with
    --bert_config_file written again at its vocab_size when one is given.

    Everything is checked before the corpus is read: the template config, and that no output is
    one of the inputs or the other output.

    Args:
      settings: the command's settings.

    Returns:
      What was written (WrittenVocabulary).

    Raises:
      SettingsError: a bad template config, an output that is an input or the other output, or
        one in an exported model's directory (its vocab.txt and config are the weights').
      CorpusError: bad input, naming the file.
    """
    if settings.output_bert_config_file and not settings.bert_config_file:
        raise SettingsError(f"--output_bert_config_file={settings.output_bert_config_file}: given without "
                            f"--bert_config_file, the config it would write again with the vocabulary's size")
    paths = expand_globs(settings.input_file, "--input_file")
    template = _bert_config(settings.bert_config_file) if settings.bert_config_file else None
    config_path = (settings.output_bert_config_file or os.path.join(os.path.dirname(settings.vocab_file),
                                                                    "bert_config.json")) if template else None
    _refuse_writing_over_inputs(settings, paths, config_path)
    for flag, path in (("--vocab_file", settings.vocab_file), ("--output_bert_config_file", config_path)):
        if path and found_output(os.path.dirname(path) or ".") == EXPORTED_MODEL:  # its weights would not fit
            raise SettingsError(f"{flag}={path}: in the directory of an exported model, whose own vocab.txt and "
                                f"bert_config.json it would write over; write the vocabulary elsewhere")
    replaced = frozenset(path for path in (settings.vocab_file, config_path) if path and files.exists(path))
    for path in (settings.vocab_file, config_path):  # a place that cannot be written, found before the corpus is read
        if path:
            files.require_writable(path)
    tokens = build_vocabulary(paths, settings.vocab_size, settings.do_lower_case, settings.input_format,
                              settings.text_field, settings.min_frequency)
    files.write_text_atomically(settings.vocab_file, "".join(f"{token}\n" for token in tokens))
    if template is not None:
        files.write_text_atomically(config_path, json.dumps({**template, "vocab_size": len(tokens)}, indent=2) + "\n")
    return WrittenVocabulary(
        vocab_file=settings.vocab_file, num_tokens=len(tokens),
        num_learned=sum(not re.fullmatch(r"\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]", token) for token in tokens),
        num_input_files=len(paths), config_file=config_path, replaced=replaced)


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


def _alphabet(sentences, normalizer, room: int) -> list[str]:
    """The ALPHABET most frequent characters of the sentences as the tokenizer normalises them
    (whitespace aside), the more frequent first, ties by code point: as many as `room` (the
    tokens after the reserved ones) holds with the pieces that continue a word with them; a
    warning says when it holds fewer."""
    counts: collections.Counter = collections.Counter()
    for sentence in sentences:
        counts.update(normalizer.normalize_str(sentence))
    found = sorted((character for character in counts if not character.isspace()),
                   key=lambda character: (-counts[character], character))
    kept, used = [], 0
    for character in found[:ALPHABET]:
        used += 1 + _may_continue_a_word(character)
        if used > room:
            break
        kept.append(character)
    if len(kept) < min(len(found), ALPHABET):
        logging.warning("--vocab_size=%d: room for the %d most frequent of the corpus's %d characters (with the "
                        "pieces that continue a word), and no learned piece; the rest become [UNK]",
                        room + len(reserved_tokens()), len(kept), len(found))
    return kept


def _may_continue_a_word(character: str) -> bool:
    """Whether the trainer may meet `character` inside a word: the pre-tokenizer makes a word of
    each punctuation mark (ASCII's, and Unicode's P categories), and the normaliser one of each CJK
    ideograph. A character said to continue one that never does costs a token and changes nothing
    else."""
    code = ord(character)
    return not (character in string.punctuation or unicodedata.category(character).startswith("P")
                or any(first <= code <= last for first, last in _CJK))


# CJK ideographs, which the normaliser parts with spaces (google-research's ranges, which the
# tokenizers library's normaliser holds too).
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def reserved_tokens() -> list[str]:
    """[PAD], [unused0] ... [unused98], [UNK], [CLS], [SEP], [MASK]: ids 0-103, as google-research's."""
    pad, *rest = SPECIAL_TOKENS
    return [pad, *(f"[unused{i}]" for i in range(UNUSED_AT_THE_START)), *rest]


def build_vocabulary(input_files: list[str], vocab_size: int, do_lower_case: bool = True, input_format: str = "auto",
                     text_field: str = "text", min_frequency: int = 2) -> list[str]:
    """The vocabulary of a corpus: its tokens in order, the line number a token's id.

    For example, a corpus of "the cat sat" and "the cats sat" lines, vocab_size=112: the reserved
    ids 0-103, then the characters that continue a word ("##a", "##s", "##t", ...), characters and
    pieces ("c", "s", "t", ..., "the", "cat", ...), then [unused99] ... to a multiple of 8. The same
    corpus and settings give the same vocabulary, token for token.

    Args:
      input_files: the corpus's text files (corpus.iter_documents reads them).
      vocab_size: tokens wanted, reserved ones included; a corpus with fewer distinct pieces gives
        fewer. The result is rounded up to a multiple of 8 with [unused] tokens.
      do_lower_case: an uncased vocabulary (lower case, accents stripped), as the data commands'
        --do_lower_case reads text.
      input_format: one of corpus.INPUT_FORMATS, or "auto" (detect_corpus_format).
      text_field: the text's field in JSON lines.
      min_frequency: a piece seen fewer times is not learned.

    Raises:
      CorpusError: bad input, naming the file.
      DataChangedError: a file changed while it was read.
    """
    from tokenizers import BertWordPieceTokenizer

    reserved = reserved_tokens()
    if input_format == "auto":
        input_format = detect_corpus_format(input_files)[0]
    elif input_format not in INPUT_FORMATS:
        raise CorpusError(f"--input_format={input_format}: expected auto or one of {', '.join(INPUT_FORMATS)}")

    def sentences():
        for path in input_files:
            for document in iter_documents(path, input_format, text_field):
                yield from document.sentences

    tokenizer = BertWordPieceTokenizer(lowercase=do_lower_case, strip_accents=do_lower_case, clean_text=True,
                                       handle_chinese_chars=True)
    # The trainer breaks ties in a hash map's order: between equally frequent characters at the
    # alphabet's cut, and, by the numbers it gives the characters that continue a word in that
    # order, between equally frequent merges; the same corpus gave another vocabulary each time
    # (huggingface/tokenizers#1794). So the alphabet is chosen here, and every character of it that
    # may continue a word is given first, in order, as a special token: numbered as given.
    read = [FileIdentity.of(path) for path in input_files]  # the corpus is read twice: the same text both times
    alphabet = _alphabet(sentences(), tokenizer.normalizer, vocab_size - len(reserved))
    continuing = [f"##{character}" for character in sorted(alphabet) if _may_continue_a_word(character)]
    tokenizer.train_from_iterator(sentences(), vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=reserved + continuing, initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), wordpieces_prefix="##", show_progress=False)
    for identity in read:
        difference = identity.difference()
        if difference is not None:
            raise DataChangedError(f"{identity.path}: changed while its vocabulary was learned ({difference}); nothing "
                                   f"was written: run the same command again on the file as it is now")
    known = set(reserved)
    learned = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
               if token not in known]
    tokens = reserved + learned[:vocab_size - len(reserved)]
    extra = -len(tokens) % 8
    return tokens + [f"[unused{UNUSED_AT_THE_START + i}]" for i in range(extra)]
