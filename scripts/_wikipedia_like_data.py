"""Not a command: Wikipedia-like training data for the GPU benchmarks (benchmark_wikipedia_like_training.py,
device_check.py): unpacked records whose lengths follow Wikipedia at 512, and their packs."""

from __future__ import annotations

import os

import numpy as np

from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.packing import wikipedia_like_histogram
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
from bert_packed.pretraining_data.instances import Instance, instance_features
from bert_packed.records import TFRecordWriter


def synthetic_instances(count: int, seed: int, vocab_size: int = 30522) -> list[Instance]:
    """Instances whose lengths follow Wikipedia at 512; content random, layout as MLPerf's."""
    rng = np.random.default_rng(seed)
    histogram = wikipedia_like_histogram(count, 512, seed=seed)
    lengths = rng.permutation(np.repeat(np.arange(1, 513), histogram))
    instances = []
    for length in np.maximum(lengths, 5):
        ids = rng.integers(1000, min(30000, vocab_size), length).astype(np.int32)
        boundary = int(rng.integers(2, length - 1))
        ids[0], ids[boundary - 1], ids[-1] = 101, 102, 102
        segments = np.zeros(length, dtype=np.int32)
        segments[boundary:] = 1
        candidates = np.setdiff1d(np.arange(1, length - 1), [boundary - 1])
        count_masked = min(76, max(1, round(length * 0.15)), len(candidates))
        positions = np.sort(rng.choice(candidates, count_masked, replace=False)).astype(np.int32)
        original = ids[positions].copy()
        ids[positions] = 103
        instances.append(Instance(ids, segments, positions, original, bool(rng.integers(0, 2))))
    return instances


def write_data(directory: str, sequences: int, vocab_size: int = 30522) -> tuple[list[str], list[str], float]:
    """(unpacked files, packed files, packing factor) of `sequences` Wikipedia-like sequences
    (token ids from 1,000 up to 30,000 or `vocab_size`, whichever is less)."""
    unpacked = os.path.join(directory, "unpacked")
    os.makedirs(unpacked)
    files = []
    for shard, chunk in enumerate(np.array_split(np.arange(sequences), 4)):
        files.append(os.path.join(unpacked, f"part-{shard:05d}.tfrecord"))
        with TFRecordWriter(files[-1]) as writer:
            writer.write_examples(instance_features(synthetic_instances(len(chunk), shard, vocab_size), Shapes(512, 76)))
    metadata = pack_pretraining_dataset(Dataset.open(files, "--input_files"), os.path.join(directory, "packed"),
                                        PackSettings(Shapes(512, 76, 3), "lp", num_shards=4))
    packed = sorted(os.path.join(directory, "packed", name) for name in os.listdir(os.path.join(directory, "packed"))
                    if name.endswith(".tfrecord"))
    print(f"\nWikipedia-like lengths at L=512: {metadata['num_sequences']:,} sequences, "
          f"{metadata['padding_fraction_unpacked']:.1%} padding unpacked, packing factor "
          f"{metadata['packing_factor']:.3f}")
    return files, packed, metadata["packing_factor"]
