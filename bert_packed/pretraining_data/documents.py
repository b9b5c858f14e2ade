"""An input file's documents, tokenized: read a line at a time and held as flat int arrays (every
token, each sentence's length, each document's number of sentences), with a seeded share held out
for evaluation; cheap to send to a worker once a pass.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

import numpy as np

from bert_packed.pretraining_data.corpus import CorpusError, iter_documents, split_sentences
from bert_packed.pretraining_data.tokenization import Tokenizer

if TYPE_CHECKING:  # the settings' own module runs the passes on what this one reads
    from bert_packed.pretraining_data.create_dataset import DatasetSettings


def tokenize_file(path: str, file_index: int, tokenizer: Tokenizer, settings: DatasetSettings):
    """Reads and tokenizes one file, holding out a seeded share of its documents for evaluation.

    The file is read a line at a time and tokenized a few thousand sentences at a time, so memory
    holds the file's token ids (4 bytes a token), not its text and the tokenizer's objects.

    Returns:
      (training documents, held-out documents, sources of empty documents); documents as three
      flat int arrays (tokens, sentence_lengths, sentences_per_document), cheap to send to a
      worker once per pass.
    """
    draws = np.random.default_rng([settings.seed, file_index, 2**31 - 1])
    parts = {False: FlatDocuments(), True: FlatDocuments()}  # held out or not
    empty = []
    documents = iter_documents(path, settings.input_format, settings.text_field)
    while chunk := list(itertools.islice(documents, 256)):
        for doc in chunk:
            if not doc.sentences:
                if settings.empty_documents == "error":
                    raise CorpusError(f"{doc.source}: empty document (no text)")
                logging.warning("%s: empty document skipped", doc.source)
                empty.append(doc.source)
        chunk = [doc for doc in chunk if doc.sentences]
        held_out = draws.random(len(chunk)) < settings.eval_fraction
        for side in (False, True):
            parts[side].add([doc for doc, h in zip(chunk, held_out) if h == side], tokenizer,
                            settings.config.max_seq_length - 3)
    return parts[False].arrays(), parts[True].arrays(), empty


class FlatDocuments:
    """Tokenized documents as flat arrays: every token, each sentence's length, each document's
    number of sentences."""

    def __init__(self):
        self.tokens, self.sentence_lengths, self.sentences_per_document = [], [], []

    def add(self, documents, tokenizer: Tokenizer, limit: int) -> None:
        """Tokenizes `documents`. A sentence longer than `limit`, what an instance's pair holds, is
        split into sentences (a paragraph or a document given as one line); one still longer is
        named: all but `limit` of its tokens go unused."""
        encoded = encode(tokenizer, [s for doc in documents for s in doc.sentences])
        sentences, counts, start = [], [], 0
        for doc in documents:
            ids = encoded[start:start + len(doc.sentences)]
            start += len(doc.sentences)
            if max(len(sentence) for sentence in ids) > limit:
                ids = [piece for text, sentence in zip(doc.sentences, ids)
                       for piece in (encode(tokenizer, split_sentences(text)) if len(sentence) > limit else [sentence])]
            longest = max(len(sentence) for sentence in ids)
            if longest > limit:
                logging.warning("%s: a sentence of %d tokens is longer than an instance (%d): all but %d of them go "
                                "unused", doc.source, longest, limit, limit)
            sentences.extend(ids)
            counts.append(len(ids))
        if sentences:
            self.tokens.append(np.concatenate(sentences).astype(np.int32))
        self.sentence_lengths.append(np.array([len(ids) for ids in sentences], dtype=np.int64))
        self.sentences_per_document.append(np.array(counts, dtype=np.int64))

    def arrays(self):
        return (np.concatenate(self.tokens or [np.zeros(0, np.int32)]),
                np.concatenate(self.sentence_lengths or [np.zeros(0, np.int64)]),
                np.concatenate(self.sentences_per_document or [np.zeros(0, np.int64)]))


def encode(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Token ids of `texts`, in batches: the tokenizer's own objects cost about 100 bytes a token
    until they are dropped."""
    return [ids for start in range(0, len(texts), 4096) for ids in tokenizer.encode(texts[start:start + 4096])]


def unflatten(tokens: np.ndarray, sentence_lengths: np.ndarray, sentences_per_document: np.ndarray):
    """The inverse of tokenize_file's flattening: documents as lists of int32 arrays."""
    sentences = np.split(tokens, np.cumsum(sentence_lengths)[:-1]) if len(sentence_lengths) else []
    bounds = np.concatenate([[0], np.cumsum(sentences_per_document)])
    return [sentences[start:end] for start, end in zip(bounds[:-1], bounds[1:])]
