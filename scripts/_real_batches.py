"""Not a command: micro-batches of real text for the update programs' export and the peer
benchmark (export_update_programs.py, benchmark_peers.py): the same sequences packed and padded.

The corpus (the shipped Wikipedia sample) is cut to Wikipedia's mix of lengths as the main job
cuts it (make_wikipedia_like_corpus.py's defaults), made into MLPerf pre-training sequences at
L=512 in memory, and packed three a row by the LP planner; a padded micro-batch holds the same
sequences one a row. Fine-tuning's are the corpus's sentences, labelled by whether they refer to
someone by a pronoun (`make finetune`'s pronouns task), packed six a row.
"""

from __future__ import annotations

import numpy as np
from _finetuning_tasks import PRONOUN

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes, model_features
from bert_packed.finetuning.encode import EncodedExamples, make_rows
from bert_packed.packing.assign import assign_to_packs
from bert_packed.packing.packer import assemble_packs, rows_from_unpacked
from bert_packed.pretraining_data.corpus import iter_documents
from bert_packed.pretraining_data.instances import MaskingConfig, create_instances, instance_features
from bert_packed.pretraining_data.length_mix import corpus_text
from bert_packed.pretraining_data.tokenization import Tokenizer

# MLPerf's shapes at L=512 (76 predictions), three sequences a pack; fine-tuning's six a row.
LENGTH, PREDICTIONS, DEPTH, FINETUNING_DEPTH = 512, 76, 3, 6
# The main job's cut of the corpus (scripts/make_wikipedia_like_corpus.py's defaults).
MEDIAN_TOKENS, SIGMA = 150.0, 1.7


class Sequences:
    """The corpus's pre-training sequences at L=512 (packer rows) and its labelled sentences."""

    def __init__(self, paths: list[str], tokenizer: Tokenizer, seed: int):
        self.tokenizer, self.seed = tokenizer, seed
        documents = []
        for index, path in enumerate(paths):
            text, _ = corpus_text(path, tokenizer, MEDIAN_TOKENS, SIGMA, [seed, index])
            documents += [tokenizer.encode(block.split("\n")) for block in text.split("\n\n") if block.strip()]
        shapes = Shapes(LENGTH, PREDICTIONS)
        special = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
        instances = create_instances(documents, MaskingConfig(LENGTH, PREDICTIONS), tokenizer.vocab_size, special,
                                     np.random.default_rng(seed))
        self.rows = rows_from_unpacked(instance_features(instances, shapes), shapes, 0, 0)
        self.sentences = [s for path in paths for document in iter_documents(path) for s in document.sentences]

    def pretraining(self, rows: int, layout: str, sequences_per_row: int | None) -> tuple[dict, np.ndarray]:
        """(features, slot_sequences) of `rows` packs chosen at random among the LP plan's packs
        of every sequence; padded: the same packs' sequences one a row (`rows` of them drawn at
        random when the micro-batch is sized by memory: sequences_per_row 1)."""
        assignment = assign_to_packs(self.rows["length"], LENGTH, DEPTH, "lp", self.seed)
        if assignment.num_packs < rows:
            raise SettingsError(f"--corpus: {assignment.num_packs} packs of its sequences, a micro-batch of {rows} "
                                f"wanted")
        chosen = np.sort(np.random.default_rng(self.seed).choice(assignment.num_packs, rows, replace=False))
        packs = assignment.members()
        members = [index for pack in chosen for index in packs[pack]]
        if layout == "packed":
            pack_of = np.repeat(np.arange(rows), [len(packs[pack]) for pack in chosen])
            position = assignment.position[members]
            packed = assemble_packs(self.rows[members], pack_of, position, rows, Shapes(LENGTH, PREDICTIONS, DEPTH))
            slots = np.full((rows, DEPTH), -1, np.int32)
            slots[pack_of, position] = members
            return _int32(model_features(packed)), slots
        if sequences_per_row == 1:  # a random `rows` of them: the packs are in the plan's order, short ones first
            members = sorted(np.random.default_rng([self.seed, 1]).choice(members, rows, replace=False).tolist())
        padded = assemble_packs(self.rows[members], np.arange(len(members)), np.zeros(len(members), int),
                                len(members), Shapes(LENGTH, PREDICTIONS))
        return _int32(model_features(padded)), np.asarray(members, np.int32)[:, None]

    def classification(self, examples: int, max_seq_length: int, layout: str) -> tuple[dict, np.ndarray]:
        """(features, slot_sequences) of rows that hold about `examples` of the corpus's sentences,
        packed six a row by the LP planner (the packs chosen at random) or one a row."""
        ids = [np.concatenate([[self.tokenizer.cls_id], s[:max_seq_length - 2], [self.tokenizer.sep_id]]).astype(np.int32)
               for s in self.tokenizer.encode(self.sentences)]
        labels = np.array([float(bool(PRONOUN.search(s))) for s in self.sentences], np.float32)
        encoded = EncodedExamples(ids, [np.zeros_like(i) for i in ids], {"labels": labels})
        assignment = assign_to_packs(encoded.lengths, max_seq_length, FINETUNING_DEPTH, "lp", self.seed)
        rows = max(1, round(examples / (len(ids) / assignment.num_packs)))
        if assignment.num_packs < rows:
            raise SettingsError(f"--corpus: {assignment.num_packs} rows of its sentences, a micro-batch of {rows} wanted")
        chosen = np.sort(np.random.default_rng(self.seed).choice(assignment.num_packs, rows, replace=False))
        packed = make_rows(encoded, assignment, max_seq_length, FINETUNING_DEPTH)
        packed = {name: value[chosen] for name, value in packed.items()}
        members = packed["example_ids"][packed["label_weights"] > 0]
        if layout == "packed":
            return packed, np.where(packed["label_weights"] > 0, packed["example_ids"], -1).astype(np.int32)
        subset = EncodedExamples([ids[m] for m in members], [encoded.segment_ids[m] for m in members],
                                 {"labels": labels[members]})
        one_a_row = assign_to_packs(subset.lengths, max_seq_length, 1, "lp", self.seed)
        padded = make_rows(subset, one_a_row, max_seq_length, 1)
        return padded, members[padded["example_ids"][:, 0]][:, None].astype(np.int32)


def _int32(features: dict) -> dict:
    return {name: np.asarray(value, np.int32) for name, value in features.items()}
