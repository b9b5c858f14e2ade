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
import logging
import re

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


def read_documents(path: str) -> list[Document]:
    """Reads a WikiExtractor file or a plain-text file (detected from its first line).

    Documents without text are kept, with no sentences, so that the caller can name them
    (WikiExtractor writes title-only pages).

    Raises:
      CorpusError: the file is missing, unreadable, not UTF-8 text, has an unclosed `<doc>`,
        or holds no text at all.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such input file") from None
    except IsADirectoryError:
        raise CorpusError(f"{path}: is a directory, expected a text file") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text (byte {e.start}): expected WikiExtractor output "
                          f"or one sentence a line") from None
    first = next((line for line in lines if line.strip()), "")
    documents = _read_wikiextractor(path, lines) if first.startswith("<doc") else _read_plain(path, lines)
    if not any(doc.sentences for doc in documents):
        raise CorpusError(f"{path}: holds no text: expected WikiExtractor output (<doc ...> ... </doc>) "
                          f"or one sentence a line with blank lines between documents")
    return documents


def _read_wikiextractor(path: str, lines: list[str]) -> list[Document]:
    documents = []
    current: Document | None = None
    title = None
    for number, line in enumerate(lines, start=1):
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
            documents.append(current)
            current = None
        elif stripped and current is not None:
            if title is not None and stripped == title and not current.sentences:
                continue  # the title line WikiExtractor repeats at the top
            current.sentences.extend(_bounded(split_sentences(stripped), f"{path}:{number}"))
    if current is not None:
        raise CorpusError(f"{path}: the <doc> opened at {current.source} is never closed (truncated file?)")
    return documents


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


def _read_plain(path: str, lines: list[str]) -> list[Document]:
    documents = [Document(f"{path}:1", [])]
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped:
            documents[-1].sentences.extend(_bounded([stripped], f"{path}:{number}"))
        elif documents[-1].sentences:
            documents.append(Document(f"{path}:{number + 1}", []))
    return documents
