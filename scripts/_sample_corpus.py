"""Not a command: the shipped sample for the benchmarks (its paths, and copies of it for larger runs)."""

from __future__ import annotations

import glob
import os
import shutil

DATA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
VOCAB = os.path.join(DATA, "bert_uncased_vocab.txt")
SAMPLE = sorted(glob.glob(os.path.join(DATA, "wikipedia_sample", "wiki_*")))


def copy_sample(directory: str, copies: int) -> list[str]:
    """Writes `copies` copies of the sample's files into `directory`; returns their paths, sorted."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for copy in range(copies):
        for path in SAMPLE:
            paths.append(os.path.join(directory, f"{copy}_{os.path.basename(path)}"))
            shutil.copy(path, paths[-1])
    return sorted(paths)
