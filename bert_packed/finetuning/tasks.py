"""Fine-tuning tasks and their files: GLUE's TSV files and a user's own JSON lines.

A task is what run_classifier reads and scores: where each example's text, text pair and label
stand in a line of its file, the labels it may take (none for a regression), and the metrics it
is judged by. GLUE's tasks read their files as google-research/bert's processors do (tab
separated, no quoting: GLUE's sentences hold quotes), with the GLUE benchmark's metrics.

    task = TASKS["mrpc"]
    examples = read_examples(task, "glue/MRPC/train.tsv")   # [Example(text, text_pair, label, line)]

A user's own task ("jsonl") is one JSON object a line, {"text": ..., "text_pair": ..., "label": ...}
(text_pair optional); its labels are those of its training file, sorted.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import sys

from bert_packed.errors import UserError
from bert_packed.storage import files

# GLUE's metrics (scored by finetuning.metrics).
ACCURACY, F1, MATTHEWS, PEARSON, SPEARMAN = "accuracy", "f1", "matthews_corrcoef", "pearson", "spearman"


class TaskDataError(UserError, ValueError):
    """A task's file holds something its task cannot read (names the file and line)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One example of a task.

    Attributes:
      text: the first (or only) text.
      text_pair: the second text, None for a single-text task.
      label: the label as written in the file (a class name), or the score of a regression; None
        in a test file (--do_predict's, unlabelled).
      line: the line of its file (1 first), for messages.
    """

    text: str
    text_pair: str | None
    label: str | float | None
    line: int


@dataclasses.dataclass(frozen=True)
class Task:
    """How a task's files are read and scored.

    Attributes:
      name: its --task_name (lower case).
      labels: the class names, in the order of the classifier's outputs; () for a regression, and
        for "jsonl", whose classes are its training file's (task_labels).
      regression: scored by a number (one output, the score), not a class.
      metrics: what its evaluation reports (ACCURACY, F1, MATTHEWS, PEARSON, SPEARMAN).
      columns: the TSV columns a line has (any of these counts); () for JSON lines.
      text_column, text_pair_column, label_column: where each stands (negative: from the end);
        text_pair_column None for single texts.
      header: whether a TSV's first line names the columns.
      dev_file: the evaluation file's name in --data_dir.
      test_file: the unlabelled file --do_predict answers, in --data_dir.
      test_columns, test_text_column, test_text_pair_column: where a test file's line holds what
        (GLUE's test files: an index first, no label; they all have a header).
    """

    name: str
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    regression: bool = False
    columns: tuple[int, ...] = ()
    text_column: int = 0
    text_pair_column: int | None = None
    label_column: int = -1
    header: bool = True
    dev_file: str = "dev.tsv"
    test_file: str = "test.tsv"
    test_columns: tuple[int, ...] = ()
    test_text_column: int = 1
    test_text_pair_column: int | None = None

    @property
    def train_file(self) -> str:
        return "train.jsonl" if self.name == "jsonl" else "train.tsv"


BINARY = ("0", "1")
ENTAILMENT = ("entailment", "not_entailment")
TASKS = {task.name: task for task in (
    Task("cola", BINARY, (MATTHEWS,), columns=(4,), text_column=3, label_column=1, header=False, test_columns=(2,)),
    Task("sst-2", BINARY, (ACCURACY,), columns=(2,), text_column=0, label_column=1, test_columns=(2,)),
    Task("mrpc", BINARY, (ACCURACY, F1), columns=(5,), text_column=3, text_pair_column=4, label_column=0,
         test_columns=(5,), test_text_column=3, test_text_pair_column=4),
    Task("qqp", BINARY, (ACCURACY, F1), columns=(6,), text_column=3, text_pair_column=4, label_column=5,
         test_columns=(3,), test_text_pair_column=2),
    Task("sts-b", (), (PEARSON, SPEARMAN), regression=True, columns=(10,), text_column=7, text_pair_column=8,
         test_columns=(9,), test_text_column=7, test_text_pair_column=8),
    # MNLI's training file has one annotator's label, its dev file five, then the gold label last.
    Task("mnli", ("contradiction", "entailment", "neutral"), (ACCURACY,), columns=(12, 16), text_column=8,
         text_pair_column=9, dev_file="dev_matched.tsv", test_file="test_matched.tsv", test_columns=(10,),
         test_text_column=8, test_text_pair_column=9),
    Task("qnli", ENTAILMENT, (ACCURACY,), columns=(4,), text_column=1, text_pair_column=2, test_columns=(3,),
         test_text_pair_column=2),
    Task("rte", ENTAILMENT, (ACCURACY,), columns=(4,), text_column=1, text_pair_column=2, test_columns=(3,),
         test_text_pair_column=2),
    Task("jsonl", (), (ACCURACY,), header=False, dev_file="dev.jsonl", test_file="test.jsonl"),
)}


def get_task(name: str) -> Task:
    """The task of a --task_name (any case, as google-research's processors take it)."""
    task = TASKS.get(name.lower())
    if task is None:
        raise TaskDataError(f"--task_name={name}: expected one of {', '.join(TASKS)}")
    return task


def read_examples(task: Task, path: str, labels: tuple[str, ...] | None = None, test: bool = False) -> list[Example]:
    """Every example of a task's file, each checked.

    Args:
      task: the task.
      path: a TSV file of a GLUE task, or a JSON-lines file of task "jsonl".
      labels: for "jsonl", the labels its examples may take (None: any, as in its training file).
      test: the file is the task's unlabelled test file (--do_predict): its examples' labels are
        None (a "jsonl" line's label, if it has one, is not read).

    Returns:
      The examples in the file's order.

    Blank lines are passed over; a text may be empty (Quora's questions have a few), as for
    google-research; the file is UTF-8 (a byte-order mark is passed over).

    Raises:
      TaskDataError: text that is not UTF-8, a line with the wrong number of columns or not a JSON
        object, a label outside the task's labels, a score that is not a finite number, or no
        example at all; each names the file and line.
    """
    with files.open_file(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise TaskDataError(f"{path}:{line}: not UTF-8 (byte 0x{data[e.start]:02x}); expected UTF-8 text") from None
    if "\r" in text and "\n" not in text.rstrip("\r\n"):
        raise TaskDataError(f"{path}: its lines end with a carriage return alone (a classic Mac's line ends), so it "
                            f"reads as one line; expected lines ending with \\n or \\r\\n")
    # Lines end at \n (and \r\n) only: a text may hold any other separator Unicode knows.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    examples = _read_jsonl(path, lines, labels, test) if task.name == "jsonl" else _read_tsv(task, path, lines, test)
    if not examples:
        raise TaskDataError(f"{path}: no examples (an empty file{' or only its header' if task.header else ''}); "
                            f"expected {task.name}'s {'JSON lines' if task.name == 'jsonl' else 'TSV lines'}")
    return examples


def task_labels(task: Task, train_examples: list[Example], path: str = "the training file") -> tuple[str, ...]:
    """The classes of a task: its own, or for "jsonl" those of its training examples (`path`),
    sorted (integers as numbers: 2 before 10).

    Raises:
      TaskDataError: a "jsonl" training file with fewer than two labels (nothing to tell apart).
    """
    if task.name != "jsonl":
        return task.labels
    found = {str(example.label) for example in train_examples}
    if len(found) < 2:
        raise TaskDataError(f"{path}: every example has the label {next(iter(found))!r}; a classifier needs at "
                            f"least two labels")
    return tuple(sorted(found, key=lambda label: (0, int(label), label) if _INTEGER.fullmatch(label) else (1, 0, label)))


_INTEGER = re.compile(r"-?[0-9]+")


def _read_tsv(task: Task, path: str, lines: list[str], test: bool) -> list[Example]:
    csv.field_size_limit(sys.maxsize)  # a GLUE line may be long; its length is not a format error
    columns, text, pair_column = ((task.test_columns, task.test_text_column, task.test_text_pair_column) if test
                                  else (task.columns, task.text_column, task.text_pair_column))
    examples = []
    for number, line in enumerate(lines, start=1):
        if ((task.header or test) and number == 1) or not line.strip():
            continue
        # A carriage return inside a text (a stray one, pasted) is read as whitespace, as a space.
        [row] = csv.reader([line.replace("\r", " ")], delimiter="\t", quoting=csv.QUOTE_NONE)
        if len(row) not in columns:
            raise TaskDataError(f"{path}:{number}: {len(row)} tab-separated columns; {task.name} expects "
                                f"{' or '.join(map(str, columns))}{' in its test file' if test else ''}")
        pair = None if pair_column is None else row[pair_column]
        label = None if test else _label(task, path, number, row[task.label_column])
        examples.append(Example(row[text], pair, label, number))
    return examples


def _label(task: Task, path: str, number: int, value: str) -> str | float:
    if task.regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise TaskDataError(f"{path}:{number}: label {value!r} is not a finite number; {task.name} is scored by "
                                f"a number")
        return score
    if value not in task.labels:
        raise TaskDataError(f"{path}:{number}: label {value!r} is not one of {task.name}'s labels "
                            f"({', '.join(task.labels)})")
    return value


def _read_jsonl(path: str, lines: list[str], labels: tuple[str, ...] | None, test: bool) -> list[Example]:
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskDataError(f"{path}:{number}: not JSON ({e.msg}); expected one object a line, "
                                f'{{"text": ..., "label": ...}}') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or ("label" not in record
                                                                                      and not test):
            raise TaskDataError(f'{path}:{number}: expected an object with a "text" string and a "label" '
                                f'(and an optional "text_pair" string)')
        pair = record.get("text_pair")
        if pair is not None and not isinstance(pair, str):
            raise TaskDataError(f'{path}:{number}: "text_pair" is {type(pair).__name__}; expected a string')
        if test:
            examples.append(Example(record["text"], pair, None, number))
            continue
        label = record["label"]
        if not isinstance(label, (str, int)) or isinstance(label, bool):
            raise TaskDataError(f'{path}:{number}: "label" is {json.dumps(label)}; expected a class name or an '
                                f'integer')
        if labels is not None and str(label) not in labels:
            raise TaskDataError(f"{path}:{number}: label {json.dumps(label)} is not among the training file's "
                                f"labels ({', '.join(labels)})")
        examples.append(Example(record["text"], pair, str(label), number))
    return examples

