"""Not a command: two fine-tuning tasks made of the shipped sample's text, whose labels the text
itself determines (for `make finetune` and scripts/benchmark_finetuning.py).

  pronouns    a short-text classification (run_classifier's jsonl task): sentences labelled
              "person" when they refer to someone by a pronoun (he, she, his, her, him, they,
              their, them), else "none"; as many of each, alternating (a quarter of the
              sample's sentences are "person": a model stuck on the majority would score 75%)
  first_year  a span task (SQuAD v1.1 JSON, run_squad): four consecutive sentences of an article
              that name a year, asked "Which year does the passage name first?", answered by the
              first such number (from 1000 to 2029, standing alone: not joined to a word or a
              number by a hyphen, as in "mid-2013" or "1957-1960")

Every tenth article goes to the dev files, the rest to the training files; the sentences are the
corpus reader's (bert_packed.pretraining_data.corpus).
"""

from __future__ import annotations

import json
import os
import re

from _sample_corpus import SAMPLE

from bert_packed.pretraining_data.corpus import iter_documents
from bert_packed.storage.files import write_text_atomically

PRONOUN = re.compile(r"\b(he|she|his|her|him|they|their|them)\b", re.IGNORECASE)
YEAR = re.compile(r"(?<![\w.,-])(1[0-9]{3}|20[0-2][0-9])(?![\w-]|[.,]\d)")
QUESTION = "Which year does the passage name first?"
CONTEXT_SENTENCES = 4


def articles() -> list[list[str]]:
    """The sample's articles, each its sentences."""
    return [document.sentences for path in SAMPLE for document in iter_documents(path)]


def write_tasks(directory: str, max_sentences: int = 6000, max_passages: int = 2000) -> dict[str, tuple[str, int]]:
    """Writes both tasks under `directory` (pronouns/{train,dev}.jsonl, first_year/{train,dev}.json),
    at most `max_sentences` and `max_passages` training examples (a tenth as many dev ones; the
    sample holds 9,378 and 1,826); returns {task: (its directory, its training examples)}."""
    sentences = {"train": ([], []), "dev": ([], [])}  # (person, none)
    passages = {"train": [], "dev": []}
    for index, article in enumerate(articles()):
        split = "dev" if index % 10 == 0 else "train"
        for text in article:
            sentences[split][0 if PRONOUN.search(text) else 1].append(text)
        for start in range(0, len(article) - CONTEXT_SENTENCES + 1, CONTEXT_SENTENCES):
            context = " ".join(article[start:start + CONTEXT_SENTENCES])
            year = YEAR.search(context)
            if year:
                passages[split].append((context, year))
    pronouns, first_year = os.path.join(directory, "pronouns"), os.path.join(directory, "first_year")
    os.makedirs(pronouns, exist_ok=True)
    os.makedirs(first_year, exist_ok=True)
    counts = {}
    for split, share in (("train", 1), ("dev", 10)):
        person, none = (texts[:max_sentences // share // 2] for texts in sentences[split])
        chosen = [{"text": text, "label": label} for pair in zip(person, none)
                  for text, label in zip(pair, ("person", "none"))]
        _write(os.path.join(pronouns, f"{split}.jsonl"), "".join(json.dumps(s) + "\n" for s in chosen))
        paragraphs = [{"context": context, "qas": [{
            "id": f"{split}-{number}", "question": QUESTION,
            "answers": [{"text": year.group(0), "answer_start": year.start()}]}]}
            for number, (context, year) in enumerate(passages[split][:max_passages // share])]
        _write(os.path.join(first_year, f"{split}.json"),
               json.dumps({"version": "1.1", "data": [{"title": "sample", "paragraphs": paragraphs}]}))
        counts[split] = (len(chosen), len(paragraphs))
    return {"pronouns": (pronouns, counts["train"][0]), "first_year": (first_year, counts["train"][1])}


def _write(path: str, text: str) -> None:
    """`text` into `path`, unless it holds it already: a run fine-tuned on it finds it unchanged."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    write_text_atomically(path, text)
