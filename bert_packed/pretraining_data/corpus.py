"""Reading text corpora into documents of sentences.

Two input formats:
- WikiExtractor output, as the MLPerf pipeline starts from: `<doc id=... url=... title=...>`, the
  title line, paragraphs (one a line), `</doc>`. Paragraphs are split into sentences here.
- Plain text as google-research/bert reads it: one sentence a line, a blank line between
  documents.

A document is a list of sentences (strings). Sentence segmentation is rule based: it needs no
downloaded model, and handles abbreviations, initials and decimal numbers.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re

from bert_packed import files
from bert_packed.errors import UserError

_ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof sr jr st mt ft vs etc al e.g i.e cf approx ca no nos vol vols fig figs
    jan feb mar apr jun jul aug sep sept oct nov dec gen col lt sgt capt cmdr adm gov sen rep
    inc ltd co corp bros dept univ est op pp ed eds rev u.s u.k a.m p.m b.c a.d
""".split())

# A candidate boundary: sentence-final punctuation, optional closing quotes or brackets, spaces,
# then something that can start a sentence.
_BOUNDARY = re.compile(r"""([.!?]+)(["'\u201d\u2019)\]]*)\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_LAST_WORD = re.compile(r"(\S+)$")


# A "sentence" longer than this (a line with no sentence boundary, a table dumped as text) is cut
# at spaces into pieces of at most this many characters: the tokenizer then works on bounded
# pieces, and each piece can fill an instance instead of being truncated into one.
MAX_SENTENCE_CHARACTERS = 4_000


class CorpusError(UserError, ValueError):
    """An input file cannot be read as a corpus."""


@dataclasses.dataclass
class Document:
    """One document: where it came from and its sentences."""

    source: str  # "file:line"
    sentences: list[str]


def split_sentences(paragraph: str) -> list[str]:
    """Splits a paragraph into sentences.

    >>> split_sentences('Dr. Smith arrived in the U.S. in 1990. He paid $3.50 for it! "Why?" '
    ...                 'she asked. J. R. R. Tolkien wrote it.')
    ['Dr. Smith arrived in the U.S. in 1990.', 'He paid $3.50 for it!', '"Why?" she asked.', \
'J. R. R. Tolkien wrote it.']
    """
    sentences = []
    start = 0
    for match in _BOUNDARY.finditer(paragraph):
        if match.group(1) == ".":
            word = _LAST_WORD.search(paragraph, start, match.start())
            word = word.group(1).lower().lstrip("(\"'") if word else ""
            # Not after an abbreviation or an initial ("J."); "U.S." ends a sentence only
            # when the next word is not capitalised, which we cannot tell: keep it joined.
            if word.rstrip(".") in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
            if "." in word and all(len(part) <= 1 for part in word.split(".")):
                continue
        end = match.end(2)
        sentence = paragraph[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


# One input file is one unit of work, held in memory as token ids while its instances are made:
# larger files are refused (MLPerf's Wikipedia shards are about 25 MB).
MAX_INPUT_BYTES = 32 << 20
# Lines are read at most this long; a longer one (no newline in megabytes) is read in pieces.
MAX_LINE_CHARACTERS = 1 << 20


def read_documents(path: str) -> list[Document]:
    """All documents of a WikiExtractor file or a plain-text file (iter_documents)."""
    return list(iter_documents(path))


def iter_documents(path: str):
    """The documents of a WikiExtractor file or a plain-text file (detected from its first
    non-empty line), read line by line.

    Documents without text are kept, with no sentences, so that the caller can name them
    (WikiExtractor writes title-only pages).

    Raises:
      CorpusError: the file is missing, not a regular file, larger than MAX_INPUT_BYTES,
        unreadable, not UTF-8 text, has an unclosed `<doc>`, or holds no text at all.
    """
    if files.isdir(path):
        raise CorpusError(f"{path}: is a directory, expected a text file")
    if files.exists(path) and not files.isfile(path):
        raise CorpusError(f"{path}: not a regular file (a device or a pipe?); expected a text file")
    if files.isfile(path) and files.size(path) > MAX_INPUT_BYTES:
        raise CorpusError(f"{path}: {files.size(path) / 2**20:,.0f} MB; one input file is one unit of work held in "
                          f"memory, at most {MAX_INPUT_BYTES >> 20} MB: split it (split -C {MAX_INPUT_BYTES >> 20}M, "
                          f"at line ends; MLPerf's shards are about 25 MB)")
    number = 0
    try:
        with files.open_file(path) as f:
            lines = ((number, line) for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_CHARACTERS), ""), 1))
            first = next(((n, line) for n, line in lines if line.strip()), None)
            if first is None:
                raise CorpusError(f"{path}: holds no text: expected WikiExtractor output (<doc ...> ... </doc>) or "
                                  f"one sentence a line with blank lines between documents")
            lines = itertools.chain([first], lines)
            read = _read_wikiextractor if first[1].lstrip().startswith("<doc") else _read_plain
            any_text = False
            for document in read(path, lines):
                any_text = any_text or bool(document.sentences)
                yield document
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such input file") from None
    except UnicodeDecodeError:
        raise CorpusError(f"{path}: not UTF-8 text (near line {number + 1}): expected WikiExtractor output or one "
                          f"sentence a line") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read: {e.strerror or e}") from None
    if not any_text:
        raise CorpusError(f"{path}: holds no text: expected WikiExtractor output (<doc ...> ... </doc>) "
                          f"or one sentence a line with blank lines between documents")


def _read_wikiextractor(path: str, lines):
    current: Document | None = None
    title = None
    for number, line in lines:
        stripped = line.strip()
        if stripped.startswith("<doc"):
            if current is not None:
                raise CorpusError(f"{path}:{number}: <doc> inside the <doc> opened at {current.source}")
            current = Document(f"{path}:{number}", [])
            match = re.search(r'title="([^"]*)"', stripped)
            title = match.group(1) if match else None
        elif stripped == "</doc>":
            if current is None:
                raise CorpusError(f"{path}:{number}: </doc> without an opening <doc>")
            yield current
            current = None
        elif stripped and current is not None:
            if title is not None and stripped == title and not current.sentences:
                continue  # the title line WikiExtractor repeats at the top
            current.sentences.extend(_bounded(split_sentences(stripped), f"{path}:{number}"))
    if current is not None:
        raise CorpusError(f"{path}: the <doc> opened at {current.source} is never closed (truncated file?)")


def _bounded(sentences: list[str], source: str) -> list[str]:
    """The sentences, each longer than MAX_SENTENCE_CHARACTERS cut at spaces into pieces (warned).

    >>> [len(piece) for piece in _bounded(["word " * 1000], "x:1")]
    [3999, 999]
    """
    result = []
    for sentence in sentences:
        if len(sentence) <= MAX_SENTENCE_CHARACTERS:
            result.append(sentence)
            continue
        pieces, start = [], 0
        while start < len(sentence):
            end = min(start + MAX_SENTENCE_CHARACTERS, len(sentence))
            if end < len(sentence):
                space = sentence.rfind(" ", start, end)
                end = space if space > start else end
            pieces.append(sentence[start:end].strip())
            start = end
        pieces = [piece for piece in pieces if piece]
        logging.warning("%s: a sentence of %s characters without a sentence boundary is cut into %d pieces of "
                        "at most %s", source, f"{len(sentence):,}", len(pieces), f"{MAX_SENTENCE_CHARACTERS:,}")
        result.extend(pieces)
    return result


def _read_plain(path: str, lines):
    document = None
    for number, line in lines:
        stripped = line.strip()
        if stripped:
            document = document or Document(f"{path}:{number}", [])
            document.sentences.extend(_bounded([stripped], f"{path}:{number}"))
        elif document is not None:
            yield document
            document = None
    if document is not None:
        yield document
