"""Pre-training instances with the semantics of the MLPerf / google-research
`create_pretraining_data.py`: NSP sentence pairs and 15% masked-LM predictions.

Per document (a list of tokenized sentences): the target length is max_seq_length - 3, or with
probability short_seq_prob a random length in [2, target]. Sentences are gathered until the
target is reached; segment A is a random prefix of them; with probability 0.5 (always, for a
one-sentence chunk) segment B comes from a random other document and the unused sentences are
put back, else B is the rest of the chunk. The pair is truncated (the longer side, at a random
end) to fit. Then min(P, max(1, round(len * masked_lm_prob))) positions (never [CLS]/[SEP]) are
masked: 80% [MASK], 10% unchanged, 10% a random vocabulary id.

Randomness comes from one NumPy Generator per input file, so results are reproducible per file
whatever the number of worker processes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_packed.features import Shapes


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """create_pretraining_data's knobs (MLPerf defaults)."""

    max_seq_length: int = 512
    max_predictions_per_seq: int = 76
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    do_whole_word_mask: bool = False


@dataclasses.dataclass
class Instance:
    """One NSP pair with its masked-LM predictions, unpadded.

    Attributes:
      input_ids: int32 [n]: [CLS] A [SEP] B [SEP] after masking.
      segment_ids: int32 [n]: 0 for [CLS] A [SEP], 1 for B [SEP].
      masked_lm_positions: int32 [p], ascending.
      masked_lm_ids: int32 [p], the original ids at those positions.
      is_random_next: whether B is from another document.
    """

    input_ids: np.ndarray
    segment_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    is_random_next: bool


def create_instances(documents: list[list[np.ndarray]], config: MaskingConfig, vocab_size: int,
                     special_ids: tuple[int, int, int], rng: np.random.Generator,
                     continuation_ids: np.ndarray | None = None) -> list[Instance]:
    """All instances of a set of documents (one pass over them: create_dataset runs a pass per
    dupe), shuffled.

    Args:
      documents: tokenized documents; each a list of int32 arrays (sentences), empty ones skipped.
      config: lengths and probabilities.
      vocab_size: ids for random replacement are drawn from [0, vocab_size).
      special_ids: ([CLS], [SEP], [MASK]) ids.
      rng: the only source of randomness.
      continuation_ids: with do_whole_word_mask, a boolean array [vocab_size] marking "##" pieces.

    Returns:
      Instances in random order.
    """
    documents = [doc for doc in documents if any(len(s) for s in doc)]
    documents = [[s for s in doc if len(s)] for doc in documents]
    instances = []
    for index in range(len(documents)):
        instances.extend(_instances_from_document(documents, index, config, vocab_size, special_ids, rng,
                                                  continuation_ids))
    order = rng.permutation(len(instances))
    return [instances[i] for i in order]


def _instances_from_document(documents, index, config, vocab_size, special_ids, rng, continuation_ids):
    cls_id, sep_id, _ = special_ids
    document = documents[index]
    max_num_tokens = config.max_seq_length - 3
    target_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_length = int(rng.integers(2, max_num_tokens + 1))

    instances = []
    chunk: list[np.ndarray] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            tokens_a = np.concatenate(chunk[:a_end])
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                target_b_length = target_length - len(tokens_a)
                for _ in range(10):
                    other = int(rng.integers(0, len(documents)))
                    if other != index:
                        break
                random_document = documents[other]
                start = int(rng.integers(0, len(random_document)))
                pieces, b_length = [], 0
                for sentence in random_document[start:]:
                    pieces.append(sentence)
                    b_length += len(sentence)
                    if b_length >= target_b_length:
                        break
                tokens_b = np.concatenate(pieces)
                i -= len(chunk) - a_end  # the unused sentences go back
            else:
                tokens_b = np.concatenate(chunk[a_end:])
            tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
            input_ids = np.concatenate([[cls_id], tokens_a, [sep_id], tokens_b, [sep_id]]).astype(np.int32)
            segment_ids = np.zeros(len(input_ids), dtype=np.int32)
            segment_ids[len(tokens_a) + 2:] = 1
            instances.append(_mask(input_ids, segment_ids, bool(is_random_next), config, vocab_size,
                                   special_ids, rng, continuation_ids))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Trims the longer segment, at a random end, until the pair fits."""
    a_start, a_end, b_start, b_end = 0, len(tokens_a), 0, len(tokens_b)
    while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
        if a_end - a_start > b_end - b_start:
            if rng.random() < 0.5:
                a_start += 1
            else:
                a_end -= 1
        elif rng.random() < 0.5:
            b_start += 1
        else:
            b_end -= 1
    return tokens_a[a_start:a_end], tokens_b[b_start:b_end]


def _mask(input_ids, segment_ids, is_random_next, config, vocab_size, special_ids, rng, continuation_ids):
    cls_id, sep_id, mask_id = special_ids
    candidates = np.flatnonzero((input_ids != cls_id) & (input_ids != sep_id))
    num_to_predict = min(config.max_predictions_per_seq,
                         max(1, int(round(len(input_ids) * config.masked_lm_prob))))
    if config.do_whole_word_mask and continuation_ids is not None:
        # Whole words: a "##" piece joins the word before it; words are chosen whole.
        starts = candidates[~continuation_ids[input_ids[candidates]]
                            | np.r_[True, np.diff(candidates) != 1]]
        words = np.split(candidates, np.searchsorted(candidates, starts[1:]))
        chosen = []
        for w in rng.permutation(len(words)):
            if len(chosen) + len(words[w]) > num_to_predict:
                continue
            chosen.extend(words[w])
            if len(chosen) >= num_to_predict:
                break
        positions = np.sort(np.asarray(chosen, dtype=np.int64))
    else:
        positions = np.sort(rng.permutation(candidates)[:num_to_predict])
    original = input_ids[positions].copy()
    draw = rng.random(len(positions))
    masked = input_ids.copy()
    masked[positions[draw < 0.8]] = mask_id
    replace = positions[(draw >= 0.8) & (draw < 0.9)]
    masked[replace] = rng.integers(0, vocab_size, len(replace))
    return Instance(masked, segment_ids, positions.astype(np.int32), original.astype(np.int32), is_random_next)


def instance_features(instances: list[Instance], shapes: Shapes) -> dict[str, np.ndarray]:
    """The unpacked features (bert_packed.features) of instances, padded to L and P: {name: [N, length]}."""
    seq, pred = shapes.max_seq_length, shapes.max_predictions_per_seq
    features = {name: np.zeros((len(instances), length), dtype=np.int64)
                for name, length in shapes.unpacked_lengths().items()}
    features["masked_lm_weights"] = np.zeros((len(instances), pred), dtype=np.float32)
    for row, instance in enumerate(instances):
        length, num_predictions = len(instance.input_ids), len(instance.masked_lm_positions)
        if length > seq or num_predictions > pred:
            raise ValueError(f"instance of {length} tokens / {num_predictions} predictions exceeds "
                             f"L={seq} / P={pred}")
        features["input_ids"][row, :length] = instance.input_ids
        features["input_mask"][row, :length] = 1
        features["segment_ids"][row, :length] = instance.segment_ids
        features["masked_lm_positions"][row, :num_predictions] = instance.masked_lm_positions
        features["masked_lm_ids"][row, :num_predictions] = instance.masked_lm_ids
        features["masked_lm_weights"][row, :num_predictions] = 1.0
        features["next_sentence_labels"][row, 0] = instance.is_random_next
    return features
