"""Examples -> token ids -> rows of the model's feature dict, packed or one example a row.

Each example becomes one sequence as google-research/bert's run_classifier makes it,
[CLS] text [SEP] (segment 0) then text_pair [SEP] (segment 1), cut to max_seq_length by its
rule (the longer text loses its last token first). Rows then hold sequences as pre-training's
packs do (bert_packed.features, FINETUNING_KEYS): each sequence keeps its own positions and its
own attention block, and its [CLS], label and example index sit in its slot of the row.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_packed.errors import InternalError, UserError
from bert_packed.features import finetuning_lengths
from bert_packed.finetuning.tasks import Example, Task
from bert_packed.packing.assign import PackAssignment, place
from bert_packed.packing.plan import PackingPlan

# [CLS] text [SEP] text_pair [SEP]: the tokens a sequence adds to its texts'.
SPECIAL_TOKENS_SINGLE, SPECIAL_TOKENS_PAIR = 2, 3


@dataclasses.dataclass(frozen=True)
class EncodedExamples:
    """A task's examples as sequences.

    Attributes:
      input_ids: int32 [n] arrays, each [CLS] text [SEP] (text_pair [SEP]).
      segment_ids: int32 [n] arrays of the same lengths.
      targets: {name: [n]}, what a row says of each sequence in its slot (features.CLASSIFIER_TARGETS:
        labels, float32, each example's class index or its score for a regression;
        features.SPAN_TARGETS: the answer's first and last token, int32).
    """

    input_ids: list[np.ndarray]
    segment_ids: list[np.ndarray]
    targets: dict[str, np.ndarray]

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(ids) for ids in self.input_ids], dtype=np.int64)


def truncated_lengths(length: int, pair_length: int | None, max_tokens: int) -> tuple[int, int]:
    """The lengths two texts keep so that together they fit `max_tokens`, by google-research's
    _truncate_seq_pair: the longer loses its last token until they fit (the pair first on a tie).

    >>> truncated_lengths(10, 3, 9), truncated_lengths(6, 6, 9), truncated_lengths(4, None, 3)
    ((6, 3), (5, 4), (3, 0))

    Args:
      length, pair_length: the texts' token counts (pair_length None: a single text).
      max_tokens: the tokens both may keep together.
    """
    if pair_length is None:
        return min(length, max_tokens), 0
    excess = length + pair_length - max_tokens
    if excess <= 0:
        return length, pair_length
    cut = min(excess, abs(length - pair_length))  # the longer down to the shorter
    if length > pair_length:
        length -= cut
    else:
        pair_length -= cut
    excess -= cut
    return length - excess // 2, pair_length - (excess - excess // 2)


def encode_examples(examples: list[Example], task: Task, labels: tuple[str, ...], tokenizer,
                    max_seq_length: int) -> EncodedExamples:
    """Tokenizes and cuts each example to one sequence of at most `max_seq_length` tokens.

    Args:
      examples: from tasks.read_examples.
      task: their task.
      labels: the task's classes (tasks.task_labels; () for a regression).
      tokenizer: a pretraining_data.tokenization.Tokenizer.
      max_seq_length: L.

    Returns:
      EncodedExamples in the examples' order.
    """
    if max_seq_length < SPECIAL_TOKENS_PAIR + 2:
        raise UserError(f"--max_seq_length={max_seq_length}: too short for [CLS] text [SEP] text_pair [SEP]; "
                        f"expected at least {SPECIAL_TOKENS_PAIR + 2}")
    texts = tokenizer.encode([e.text for e in examples])
    pairs = tokenizer.encode([e.text_pair or "" for e in examples])
    input_ids, segment_ids = [], []
    for example, text, pair in zip(examples, texts, pairs):
        if example.text_pair is None:
            keep, _ = truncated_lengths(len(text), None, max_seq_length - SPECIAL_TOKENS_SINGLE)
            ids = np.concatenate([[tokenizer.cls_id], text[:keep], [tokenizer.sep_id]])
            segments = np.zeros(len(ids), dtype=np.int32)
        else:
            keep, keep_pair = truncated_lengths(len(text), len(pair), max_seq_length - SPECIAL_TOKENS_PAIR)
            ids = np.concatenate([[tokenizer.cls_id], text[:keep], [tokenizer.sep_id], pair[:keep_pair],
                                  [tokenizer.sep_id]])
            segments = np.concatenate([np.zeros(keep + 2, np.int32), np.ones(keep_pair + 1, np.int32)])
        input_ids.append(ids.astype(np.int32))
        segment_ids.append(segments)
    if task.regression:
        values = [0.0 if e.label is None else float(e.label) for e in examples]  # None: a test example's, unscored
    else:
        index = {label: i for i, label in enumerate(labels)}
        unknown = [e for e in examples if e.label is not None and str(e.label) not in index]
        if unknown:  # read_examples takes the labels of the training file
            raise InternalError(f"label {unknown[0].label!r} (line {unknown[0].line}) is not one of {labels}")
        values = [0 if e.label is None else index[str(e.label)] for e in examples]
    return EncodedExamples(input_ids, segment_ids, {"labels": np.asarray(values, dtype=np.float32)})


def row_layout(encoded: EncodedExamples, max_seq_length: int, max_sequences_per_pack: int
               ) -> dict[str, tuple[int, np.dtype]]:
    """{feature: (its length in a row, its dtype)} of the rows of `encoded` (features'
    finetuning_lengths; int32, a target as its encoded dtype)."""
    lengths = finetuning_lengths(max_seq_length, max_sequences_per_pack, tuple(encoded.targets))
    return {name: (length, encoded.targets[name].dtype if name in encoded.targets else np.dtype(np.int32))
            for name, length in lengths.items()}


def make_rows(encoded: EncodedExamples, assignment: PackAssignment, max_seq_length: int,
              max_sequences_per_pack: int) -> dict[str, np.ndarray]:
    """The rows of the model's feature dict that hold the sequences where `assignment` puts them.

    For sequences of 3 and 2 tokens sharing a row of 6 (S = 2), example 0 labelled 1, example 1
    labelled 0:

        input_ids     [c a s c b s]  -> [CLS] a [SEP] [CLS] b [SEP], then 0
        sequence_ids  [1 1 1 2 2 0]     the sequence index of each token, 0 for padding
        positions     [0 1 2 0 1 0]     restarting for each sequence
        cls_positions [0 3]             labels [1 0], label_weights [1 1], example_ids [0 1]

    Args:
      encoded: the sequences.
      assignment: packing.assign.assign_to_packs's placement of them (S = 1: one a row).
      max_seq_length, max_sequences_per_pack: L and S of the rows.

    Returns:
      {feature: array [num_packs, length]} with features.finetuning_lengths' keys for the encoded
      targets (int32; a target as its encoded dtype).
    """
    rows = {name: np.zeros((assignment.num_packs, length), dtype)
            for name, (length, dtype) in row_layout(encoded, max_seq_length, max_sequences_per_pack).items()}
    for row, members in enumerate(assignment.members()):
        start = 0
        for slot, example in enumerate(members):
            ids, end = encoded.input_ids[example], start + len(encoded.input_ids[example])
            rows["input_ids"][row, start:end] = ids
            rows["segment_ids"][row, start:end] = encoded.segment_ids[example]
            rows["sequence_ids"][row, start:end] = slot + 1
            rows["positions"][row, start:end] = np.arange(len(ids))
            rows["cls_positions"][row, slot] = start
            for name, values in encoded.targets.items():
                rows[name][row, slot] = values[example]
            rows["label_weights"][row, slot] = 1
            rows["example_ids"][row, slot] = example
            start = end
    return rows


@dataclasses.dataclass(frozen=True)
class RepackedRows:
    """A training set packed anew each epoch (--input_mode=packed_online): one plan of its
    lengths' histogram, and in each epoch which sequences of one length take which slot drawn
    again (packing.assign.place, keyed by the seed and the epoch), so that the sequences sharing
    a pack, and so an update, change from epoch to epoch. Every epoch has plan.num_packs rows.

    Attributes:
      encoded: the sequences.
      plan: the plan of their lengths (assign_to_packs' of the first epoch).
      max_seq_length, max_sequences_per_pack: L and S of the rows.
      seed: the run's seed.
    """

    encoded: EncodedExamples
    plan: PackingPlan
    max_seq_length: int
    max_sequences_per_pack: int
    seed: int

    @property
    def num_rows(self) -> int:
        return self.plan.num_packs

    @property
    def layout(self) -> dict[str, tuple[int, np.dtype]]:
        """Every epoch's row_layout."""
        return row_layout(self.encoded, self.max_seq_length, self.max_sequences_per_pack)

    def epoch(self, epoch: int) -> dict[str, np.ndarray]:
        """The rows of `epoch` (make_rows' layout)."""
        assignment = place(self.encoded.lengths, self.plan, self.max_seq_length, self.seed * 1_000_003 + epoch)
        return make_rows(self.encoded, assignment, self.max_seq_length, self.max_sequences_per_pack)
