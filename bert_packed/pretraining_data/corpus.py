"""Reading text corpora into documents of sentences.

Four input formats (INPUT_FORMATS), or "auto": the format detected from a file's first lines.
- `wikiextractor`: WikiExtractor output, as the MLPerf pipeline starts from: `<doc id=... url=...
  title=...>`, the title line, paragraphs (one a line), `</doc>`.
- `sentences`: google-research/bert's format: one sentence a line, a blank line between documents.
- `documents`: one document a line.
- `jsonl`: JSON lines, one object a document, its text in a field (`text` unless told); the text's
  lines are paragraphs.

A document is a list of sentences (strings): paragraphs and document lines are split into
sentences here. Segmentation is rule based: it needs no downloaded model, and handles
abbreviations, initials and decimal numbers.
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import errno
import functools
import gzip
import itertools
import json
import logging
import lzma
import re
import zlib

from bert_packed.errors import StorageError, UserError, raise_if_retryable
from bert_packed.storage import files

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


# Compressed corpora are read as they are (files.compression tells which).
_DECOMPRESS = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}
# What a file's name says it is: read by its first bytes, it must be that.
_SUFFIXES = ((".gz", "gzip"), (".bz2", "bzip2"), (".xz", "xz"), (".zst", "zstd"), (".zip", "zip"))


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

INPUT_FORMATS = {
    "wikiextractor": "WikiExtractor output (<doc ...> ... </doc>)",
    "sentences": "one sentence a line, a blank line between documents",
    "documents": "one document a line",
    "jsonl": "JSON lines, one document an object",
}
# What detection reads of a file: enough lines to see blank lines between documents, bounded.
_DETECTION_LINES = 1_000
_DETECTION_CHARACTERS = 1 << 20


def detect_format(path: str) -> tuple[str, str]:
    """The format of a corpus file, from its first lines, and why.

    A first line that opens a `<doc>` is WikiExtractor's, one that opens a JSON object is JSON
    lines. Otherwise groups of lines between blank lines are documents of one sentence a line;
    lines that mostly hold several sentences, and are not grouped, are one document a line; and
    lines of one sentence each, not grouped, are sentences too (documents of one line, or one
    document, which the statistics after the run then name).

    Returns:
      (one of INPUT_FORMATS, the reason in a few words).

    Raises:
      CorpusError: as iter_documents.
    """
    head, characters = [], 0
    with contextlib.closing(_numbered_lines(path)) as lines:
        for _, line in lines:
            head.append(line.strip())
            characters += len(line)
            if len(head) >= _DETECTION_LINES or characters >= _DETECTION_CHARACTERS:
                break
    text = [line for line in head if line]
    if not text:
        raise CorpusError(f"{path}: holds no text: expected {_FORMATS_TEXT}")
    if text[0].startswith("<doc"):
        return "wikiextractor", "its first line opens a <doc>"
    if text[0].startswith("{"):
        return "jsonl", "its first line opens a JSON object"
    first, last = head.index(text[0]), len(head) - 1 - head[::-1].index(text[-1])
    blank_lines = "" in head[first:last]
    several = sum(len(split_sentences(line)) > 1 for line in text)
    mostly_several = several * 2 >= len(text)
    if blank_lines and any(above and below for above, below in zip(head[first:last], head[first + 1:last + 1])):
        return "sentences", "blank lines separate groups of lines"
    if mostly_several:  # a line is a document, with or without blank lines between them
        return "documents", ("a blank line after each line" if blank_lines else "no blank lines") + \
            f", and {several} of its first {len(text)} lines hold several sentences"
    if blank_lines:
        return "sentences", "blank lines separate its lines: documents of one line"
    return "sentences", "no blank lines, and its lines hold one sentence each: one document"


def detect_corpus_format(paths: list[str]) -> tuple[str, str]:
    """The format of a corpus's files (detect_format: every file's), and why.

    Raises:
      CorpusError: two files detect as different formats (a file of one document a line read as
        sentences would cut its documents apart, silently), naming both; as detect_format.
    """
    input_format, reason = detect_format(paths[0])
    for path in paths[1:]:
        other, other_reason = detect_format(path)
        if other != input_format:
            raise CorpusError(f"{paths[0]} reads as {INPUT_FORMATS[input_format]} ({reason}) but {path} as "
                              f"{INPUT_FORMATS[other]} ({other_reason}): the files of one corpus are read in one "
                              f"format; give --input_format, or make records of each format in their own run")
    return input_format, reason


_FORMATS_TEXT = "WikiExtractor output (<doc ...> ... </doc>), one sentence a line with blank lines between documents, " \
                "one document a line, or JSON lines (--input_format)"


def read_documents(path: str, input_format: str = "auto", text_field: str = "text") -> list[Document]:
    """All documents of a corpus file (iter_documents)."""
    return list(iter_documents(path, input_format, text_field))


def iter_documents(path: str, input_format: str = "auto", text_field: str = "text"):
    """The documents of a corpus file, read line by line.

    Documents without text are kept, with no sentences, so that the caller can name them
    (WikiExtractor writes title-only pages).

    Args:
      path: the file.
      input_format: one of INPUT_FORMATS, or "auto" (detect_format).
      text_field: the field of a JSON lines object that holds its text.

    Raises:
      CorpusError: the file is missing, not a regular file, larger than MAX_INPUT_BYTES,
        unreadable, not UTF-8 text, not in the format (an unclosed `<doc>`, a line that is not a
        JSON object with the text field, a `<doc>` line in plain text), or holds no text at all.
    """
    if input_format == "auto":
        input_format = detect_format(path)[0]
    read = {"wikiextractor": _read_wikiextractor, "sentences": _read_sentences, "documents": _read_lines_as_documents,
            "jsonl": functools.partial(_read_json_lines, text_field=text_field)}[input_format]
    any_text = False
    for document in read(path, _numbered_lines(path)):
        any_text = any_text or bool(document.sentences)
        yield document
    if not any_text:
        raise CorpusError(f"{path}: holds no text read as {INPUT_FORMATS[input_format]} (--input_format="
                          f"{input_format}); expected {_FORMATS_TEXT}")


def _numbered_lines(path: str):
    """(line number, line) of a text file, each line at most MAX_LINE_CHARACTERS long; the
    file's problems as CorpusError naming it."""
    if files.isdir(path):
        raise CorpusError(f"{path}: is a directory, expected a text file")
    if files.exists(path) and not files.isfile(path):
        raise CorpusError(f"{path}: not a regular file (a device or a pipe?); expected a text file")
    if files.isfile(path) and files.size(path) > MAX_INPUT_BYTES:
        raise CorpusError(f"{path}: {files.size(path) / 2**20:,.0f} MB; one input file is one unit of work held in "
                          f"memory, at most {MAX_INPUT_BYTES >> 20} MB: split it (split -C {MAX_INPUT_BYTES >> 20}M, "
                          f"at line ends; MLPerf's shards are about 25 MB)")
    number, whole, characters, kind = 0, True, 0, None
    try:
        kind = files.compression(path)
        named = next((name for suffix, name in _SUFFIXES if path.lower().endswith(suffix)), None)
        if named is not None and kind != named:
            raise CorpusError(f"{path}: named as {named}-compressed, but its first bytes are not {named}'s"
                              + (f" ({kind}'s)" if kind else "") + "; expected a file of what its name says")
        if kind in ("zstd", "zip"):
            raise CorpusError(f"{path}: {kind}-compressed; decompress it first (gzip, bzip2 and xz files are read as "
                              f"they are)")
        with contextlib.ExitStack() as opened:
            if kind is None:
                f = opened.enter_context(files.open_file(path))
            else:
                f = opened.enter_context(_DECOMPRESS[kind](opened.enter_context(files.open_file(path, "rb")), "rt",
                                                           encoding="utf-8"))
            for line in iter(lambda: f.readline(MAX_LINE_CHARACTERS), ""):
                number += whole  # a line longer than MAX_LINE_CHARACTERS comes in pieces of one number
                if number == 1 and whole:
                    line = line.removeprefix("\ufeff")  # a byte-order mark is not text
                whole = line.endswith("\n")
                characters += len(line)
                if characters > MAX_INPUT_BYTES:
                    raise CorpusError(f"{path}: more than {MAX_INPUT_BYTES >> 20} MB of text once decompressed; one "
                                      f"input file is one unit of work held in memory: split it")
                yield number, line
    except UnicodeDecodeError:
        compressed = f" once {kind}-decompressed" if kind else ""
        raise CorpusError(f"{path}: not UTF-8 text{compressed} (near line {number + 1}): expected "
                          f"{_FORMATS_TEXT}") from None
    except StorageError as e:
        raise_if_retryable(e)
        reason = "no such input file" if e.errno == errno.ENOENT else f"cannot read: {e.reason}"
        raise CorpusError(f"{path}: {reason}") from None
    except (EOFError, OSError, lzma.LZMAError, zlib.error) as e:  # the decompressor's: the storage's are StorageErrors
        raise CorpusError(f"{path}: {kind}-compressed, and it cannot be decompressed after line {number} ({e}): cut "
                          f"short or damaged?") from None


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


def _read_sentences(path: str, lines):
    document = None
    for number, line in lines:
        stripped = _plain(path, number, line, "sentences")
        if stripped:
            document = document or Document(f"{path}:{number}", [])
            document.sentences.extend(_bounded([stripped], f"{path}:{number}"))
        elif document is not None:
            yield document
            document = None
    if document is not None:
        yield document


def _whole_lines(lines):
    """(line number, line) with a line read in pieces (longer than MAX_LINE_CHARACTERS) joined
    again: for the formats where a line is a unit (a document, a JSON object)."""
    for number, pieces in itertools.groupby(lines, key=lambda numbered: numbered[0]):
        yield number, "".join(line for _, line in pieces)


def _read_lines_as_documents(path: str, lines):
    for number, line in _whole_lines(lines):
        stripped = _plain(path, number, line, "documents")
        if stripped:
            yield Document(f"{path}:{number}", _bounded(split_sentences(stripped), f"{path}:{number}"))


def _plain(path: str, number: int, line: str, input_format: str) -> str:
    """A plain-text line, stripped; a WikiExtractor line in it is refused (the files of a corpus
    are read in one format: a `<doc>` read as text would train on its tags)."""
    stripped = line.strip()
    if stripped.startswith("<doc ") or stripped == "</doc>":
        raise CorpusError(f"{path}:{number}: a WikiExtractor <doc> line in a file read as "
                          f"{INPUT_FORMATS[input_format]} (--input_format={input_format}): the files of one corpus "
                          f"are read in one format; give --input_format=wikiextractor, or convert the file")
    if stripped.startswith("{") and isinstance(_json_or_none(stripped), dict):
        raise CorpusError(f"{path}:{number}: a JSON object in a file read as {INPUT_FORMATS[input_format]} "
                          f"(--input_format={input_format}): the files of one corpus are read in one format; give "
                          f"--input_format=jsonl, or convert the file")
    return stripped


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _what_json_holds(record, text_field: str) -> str:
    """What a JSON lines record holds instead of a string text field, in a few words."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}"
    if text_field in record:
        return f"\"{text_field}\" holding a JSON {type(record[text_field]).__name__}"
    return f"fields {', '.join(sorted(record)[:5])}" if record else "an empty object"


def _read_json_lines(path: str, lines, text_field: str):
    for number, line in _whole_lines(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}:{number}: not a JSON object ({e.msg} at column {e.colno}); expected JSON "
                              f"lines, one document an object (--input_format=jsonl)") from None
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise CorpusError(f"{path}:{number}: expected a JSON object with a string field \"{text_field}\" "
                              f"(--text_field), found {_what_json_holds(record, text_field)}")
        source = f"{path}:{number}"
        yield Document(source, [sentence for paragraph in text.split("\n") if paragraph.strip()
                                for sentence in _bounded(split_sentences(paragraph.strip()), source)])
