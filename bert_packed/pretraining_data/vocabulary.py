"""A WordPiece vocabulary for a corpus, in google-research/bert's layout.

BERT's published vocabularies begin with [PAD], then [unused0] to [unused98] (ids a user may give
to tokens of their own without resizing the model), [UNK], [CLS], [SEP] and [MASK]; the learned
pieces follow, a piece that continues a word spelled with `##`. build_vocabulary learns the
pieces of a corpus (any input format create_pretraining_data reads) with the Hugging Face
`tokenizers` WordPiece trainer, normalised as the Tokenizer that will read them (lower-cased and
accents stripped for an uncased vocabulary), and lays them out that way, its size a multiple of
8 (tensor cores compute the output layer in tiles of 8): more [unused] tokens at the end where
the pieces fall short.
"""

from __future__ import annotations

import dataclasses

from bert_packed.errors import SettingsError
from bert_packed.pretraining_data.corpus import INPUT_FORMATS, CorpusError, detect_corpus_format, iter_documents
from bert_packed.pretraining_data.create_command import CorpusSettings
from bert_packed.pretraining_data.tokenization import SPECIAL_TOKENS
from bert_packed.settings import setting

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
        if not self.input_file or not self.vocab_file:
            raise SettingsError("--input_file and --vocab_file are required: the corpus, and where the vocabulary goes")
        if self.vocab_size < len(reserved_tokens()) + 8 or self.min_frequency < 1:
            raise SettingsError(f"--vocab_size={self.vocab_size} must be at least {len(reserved_tokens()) + 8} (the "
                                f"reserved tokens and some pieces) and --min_frequency at least 1")


def reserved_tokens() -> list[str]:
    """[PAD], [unused0] ... [unused98], [UNK], [CLS], [SEP], [MASK]: ids 0-103, as google-research's."""
    pad, *rest = SPECIAL_TOKENS
    return [pad, *(f"[unused{i}]" for i in range(UNUSED_AT_THE_START)), *rest]


def build_vocabulary(input_files: list[str], vocab_size: int, do_lower_case: bool = True, input_format: str = "auto",
                     text_field: str = "text", min_frequency: int = 2) -> list[str]:
    """The vocabulary of a corpus: its tokens in order, the line number a token's id.

    For example, a corpus of "the cat sat" and "the cats sat" lines, vocab_size=112: the reserved
    ids 0-103, then characters and pieces ("c", "s", "t", ..., "##s", "the", "cat", ...), then
    [unused99] ... to a multiple of 8.

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
    tokenizer.train_from_iterator(sentences(), vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=reserved, limit_alphabet=ALPHABET, wordpieces_prefix="##",
                                  show_progress=False)
    learned = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    known = set(reserved)
    tokens = reserved + [token for token, _ in learned if token not in known][:vocab_size - len(reserved)]
    extra = -len(tokens) % 8
    return tokens + [f"[unused{UNUSED_AT_THE_START + i}]" for i in range(extra)]
