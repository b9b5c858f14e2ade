import json
import os
import re
import sys

import pytest

# Keep TensorFlow quiet and on the CPU in every test process.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(REPO, "data", "bert_uncased_vocab.txt")
SAMPLE = os.path.join(REPO, "data", "wikipedia_sample", "wiki_00")

# Tiny shapes for the data tests: L, P, S.
MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK = 128, 20, 3

# A tiny BERT for the training tests (BertConfig arguments).
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=MAX_SEQ_LENGTH)


def write_corpus(directory, num_files=2, docs_per_file=8, paragraphs_per_doc=2):
    """Writes small WikiExtractor files cut from the shipped sample (real text, hermetic copy)."""
    with open(SAMPLE, encoding="utf-8") as f:
        text = f.read()
    docs = re.findall(r"(<doc [^>]*>)\n(.*?)\n</doc>", text, flags=re.S)
    paths = []
    for i in range(num_files):
        chunks = []
        for header, body in docs[i * docs_per_file:(i + 1) * docs_per_file]:
            lines = [line for line in body.split("\n") if line.strip()][:paragraphs_per_doc + 1]
            chunks.append(header + "\n" + "\n\n".join(lines) + "\n</doc>\n")
        path = os.path.join(directory, f"wiki_{i:02d}")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(chunks))
        paths.append(path)
    return paths


def dataset_settings(dupe_factor=2, seed=12345, short_seq_prob=0.5, **masking):
    from bert_packed.pretraining_data.create_dataset import DatasetSettings
    from bert_packed.pretraining_data.instances import MaskingConfig

    config = MaskingConfig(MAX_SEQ_LENGTH, MAX_PREDICTIONS, short_seq_prob=short_seq_prob, **masking)
    return DatasetSettings(VOCAB, True, config, dupe_factor, seed)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="session")
def unpacked_dir(corpus, tmp_path_factory):
    from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset

    directory = str(tmp_path_factory.mktemp("unpacked"))
    create_pretraining_dataset(corpus, directory, dataset_settings(), num_workers=1)
    return directory


@pytest.fixture(scope="session")
def packed_dir(unpacked_dir, tmp_path_factory):
    from bert_packed.features import Shapes
    from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset

    directory = str(tmp_path_factory.mktemp("packed"))
    files = sorted(os.path.join(unpacked_dir, n) for n in os.listdir(unpacked_dir) if n.endswith(".tfrecord"))
    settings = PackSettings(Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK), "lp", num_shards=2)
    pack_pretraining_dataset(files, directory, settings, num_workers=1)
    return directory


@pytest.fixture(autouse=True)
def _release_compiled_steps():
    """After each test, the compiled steps it held may serve the next test of their graph shape
    (tests/runs.py; loaded only by the tests that train)."""
    yield
    runs = sys.modules.get("runs")
    if runs is not None:
        runs.release()


def tfrecords(directory):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".tfrecord"))


@pytest.fixture
def bert_config_file(tmp_path):
    """TINY as a google-research bert_config.json."""
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**TINY, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                                "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2,
                                "initializer_range": 0.02}))
    return str(path)
