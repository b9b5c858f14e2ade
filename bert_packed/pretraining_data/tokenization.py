"""BERT uncased WordPiece through HF `tokenizers` (same ids as the google-research vocabulary)."""

from __future__ import annotations

import os

import numpy as np

from bert_packed.errors import UserError
from bert_packed.storage import files

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# The commands' default --vocab_file, a path in the checkout. Outside it (an installed wheel), the
# copy the package carries is read instead.
DEFAULT_VOCAB_FILE = "data/bert_uncased_vocab.txt"
PACKAGED_VOCAB_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resources",
                                   "bert_uncased_vocab.txt")


def vocabulary_path(vocab_file: str) -> str:
    """`vocab_file`, or for DEFAULT_VOCAB_FILE where it is not (outside the checkout) the copy the
    package carries."""
    return PACKAGED_VOCAB_FILE if vocab_file == DEFAULT_VOCAB_FILE and not files.isfile(vocab_file) else vocab_file


class VocabularyError(UserError, ValueError):
    """The vocabulary file is missing or is not a BERT WordPiece vocabulary."""


class Tokenizer:
    """WordPiece tokenizer with BERT uncased normalisation (lower case, accents stripped).

    Attributes:
      vocab_file: the vocabulary, one token a line; the line number is the id.
      do_lower_case: lower-case and strip accents (BERT uncased).
      vocab_size: the ids' range, 0 to vocab_size - 1: its lines (a token on two lines takes the id
        of the last, and the ids past it stay taken).
      cls_id, sep_id, mask_id, pad_id: ids of the special tokens.
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True):
        from tokenizers import BertWordPieceTokenizer  # imported here: worker processes import lazily

        if not files.isfile(vocab_file):
            raise VocabularyError(f"{vocab_file}: vocabulary file not found (expected a BERT vocab.txt, "
                                  f"e.g. data/bert_uncased_vocab.txt)")
        try:
            with files.open_file(vocab_file) as f:
                vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        except UnicodeDecodeError as e:
            raise VocabularyError(f"{vocab_file}: not a text vocabulary (byte {e.start} is not UTF-8); expected "
                                  f"a BERT vocab.txt, one token a line") from None
        missing = [token for token in SPECIAL_TOKENS if token not in vocab]
        if missing:
            raise VocabularyError(f"{vocab_file}: not a BERT vocabulary: missing {', '.join(missing)}")
        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.vocab_size = max(vocab.values()) + 1
        self.pad_id, self.cls_id, self.sep_id, self.mask_id = (
            vocab["[PAD]"], vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"])
        self._tokenizer = BertWordPieceTokenizer(  # the tokens, not the path: it may be a gs:// one
            vocab, lowercase=do_lower_case, strip_accents=do_lower_case, clean_text=True,
            handle_chinese_chars=True)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (no [CLS]/[SEP]), as int32 arrays.

        >>> tokenizer = Tokenizer("data/bert_uncased_vocab.txt")
        >>> [ids.tolist() for ids in tokenizer.encode(["Packing BERT is fun.", "Café"])]
        [[14743, 14324, 2003, 4569, 1012], [7668]]
        """
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Token ids of each text, and where each token stands in it: int32 [n] and int64 [n, 2]
        (its first character and one past its last, in the text as given, accents and case included).

        >>> tokenizer = Tokenizer("data/bert_uncased_vocab.txt")
        >>> [(ids.tolist(), spans.tolist()) for ids, spans in tokenizer.encode_with_offsets(["Zürich's"])]
        [([10204, 1005, 1055], [[0, 6], [6, 7], [7, 8]])]
        """
        return [(np.asarray(e.ids, dtype=np.int32), np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2))
                for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]
