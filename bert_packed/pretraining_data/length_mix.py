"""Cuts a corpus's articles into documents of a chosen mix of lengths: the main job's
Wikipedia-like corpus (scripts/make_wikipedia_like_corpus.py, docs/data.md).

An article's sentences stay as they are and in their order; only where one document ends and the
next begins is chosen, so that the documents' token counts follow a log-normal. Its median and
spread set the mix of lengths of the pre-training records made from them (short documents make
short records, long ones full records), and so their packing factor.
"""

from __future__ import annotations

import numpy as np

from bert_packed.errors import OutputDirectoryError
from bert_packed.pretraining_data.corpus import read_documents
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically


def cut_article(sentence_lengths: list[int], targets) -> list[int]:
    """Cuts an article's sentences into documents of consecutive sentences, one a target length.

    A document takes sentences until it holds its target's tokens; the sentence that crosses the
    target stays in only if at most half of it lies beyond. Every document holds at least one
    sentence, and every sentence is in one document, in order.

    >>> cut_article([10, 10, 10, 10, 10], iter([15, 22, 100]))   # 10+10 > 15 by 5: kept
    [2, 2, 1]

    Args:
      sentence_lengths: the article's sentences' token counts, in order.
      targets: an iterator of target token counts, one taken per document.

    Returns:
      The documents' sizes in sentences, summing to len(sentence_lengths).
    """
    sizes, start = [], 0
    while start < len(sentence_lengths):
        target, end, tokens = next(targets), start + 1, sentence_lengths[start]
        while end < len(sentence_lengths) and tokens + sentence_lengths[end] / 2 <= target:
            tokens += sentence_lengths[end]
            end += 1
        sizes.append(end - start)
        start = end
    return sizes


def corpus_text(path: str, tokenizer: Tokenizer, median_tokens: float, sigma: float, seed, input_format: str = "auto",
                text_field: str = "text") -> tuple[str, dict]:
    """One input file's articles cut into documents whose token counts are log-normal.

    Args:
      path: a text file in any of create_pretraining_data's input formats.
      tokenizer: counts the sentences' tokens.
      median_tokens, sigma: the log-normal: exp(N(log(median_tokens), sigma ** 2)) tokens.
      seed: of the NumPy Generator that draws the lengths.
      input_format, text_field: how `path` is read (corpus.iter_documents).

    Returns:
      (the text to write: one sentence a line, a blank line between documents; its counts).
    """
    rng = np.random.default_rng(seed)
    targets = iter(lambda: median_tokens * np.exp(sigma * rng.standard_normal()), None)
    blocks, counts = [], {"articles": 0, "documents": 0, "sentences": 0, "tokens": 0, "document_tokens": []}
    for article in read_documents(path, input_format, text_field):
        if not article.sentences:
            continue
        lengths = [len(ids) for ids in tokenizer.encode(article.sentences)]
        start = 0
        for size in cut_article(lengths, targets):
            blocks.append("\n".join(article.sentences[start:start + size]))
            counts["document_tokens"].append(sum(lengths[start:start + size]))
            start += size
        counts["articles"] += 1
        counts["sentences"] += len(lengths)
        counts["tokens"] += sum(lengths)
    counts["documents"] = len(blocks)
    return "\n\n".join(blocks) + "\n", counts


def write_once(path: str, text: str) -> bool:
    """Writes `text` to `path` unless it holds it already; returns whether it wrote.

    Raises:
      OutputDirectoryError: `path` holds other text (other inputs, flags or seed).
    """
    if files.exists(path):
        with files.open_file(path, "rb") as f:
            if f.read() == text.encode("utf-8"):
                return False
        raise OutputDirectoryError(f"{path}: holds another corpus (other inputs, flags or seed): give another "
                                   f"--output_dir, or remove it")
    write_text_atomically(path, text)
    return True
