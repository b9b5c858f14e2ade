import atexit
import importlib
import io
import json
import multiprocessing.process
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from bert_packed.training.step_pool import StepPool

# Python's platform asks `uname -p` in a process once, and keeps the answer: Beam asks at import,
# which in a fast test would start that process (_no_process_in_the_fast_tier).
platform.processor()

# The tests' packages (PyTorch, transformers, JAX, Beam: the Makefile's test install) are not
# compiled when installed: where PYTHONDONTWRITEBYTECODE is set (this project's machines set it),
# every test process would compile what it imports afresh. So the suite caches what it imports
# as it imports it, in this process and in those it starts (the xdist workers included).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Keep TensorFlow quiet and on the CPU in every test process.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The real BERT uncased vocabulary: for the tests about it (and the commands' default).
REAL_VOCAB = os.path.join(REPO, "data", "bert_uncased_vocab.txt")
SAMPLE = os.path.join(REPO, "data", "wikipedia_sample", "wiki_00")

# Tiny shapes for the data tests: L, P, S.
MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK = 128, 20, 3


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


def _small_vocabulary(directory):
    """The test vocabulary: the special tokens, then exactly the WordPiece tokens that the real
    vocabulary makes of the test corpus (write_corpus), in the real vocabulary's order.

    Greedy longest-match WordPiece over a subset of the vocabulary that holds every piece it used
    tokenizes the same text the same way (no longer match can appear, none it took is missing),
    so the corpus reads as with the real vocabulary, with other ids. A tiny BERT then carries
    about 1,300 embeddings instead of 30,522 (which were 97.7% of its parameters).
    """
    from bert_packed.pretraining_data.corpus import iter_documents
    from bert_packed.pretraining_data.tokenization import SPECIAL_TOKENS, Tokenizer

    with open(REAL_VOCAB, encoding="utf-8") as f:
        real = f.read().splitlines()
    tokenizer = Tokenizer(REAL_VOCAB)
    used = set()
    for path in write_corpus(directory):
        for document in iter_documents(path):
            for ids in tokenizer.encode(document.sentences):
                used.update(ids.tolist())
    tokens = list(SPECIAL_TOKENS) + [real[i] for i in sorted(used) if real[i] not in SPECIAL_TOKENS]
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{token}\n" for token in tokens))
    return path, tokens


# Built when this file is imported, once per test process: TINY and the tests' command lines need
# its size and its path as constants.
_VOCAB_DIRECTORY = tempfile.mkdtemp(prefix="bert_packed_tests_vocab_")
atexit.register(shutil.rmtree, _VOCAB_DIRECTORY, ignore_errors=True)
VOCAB, VOCAB_TOKENS = _small_vocabulary(_VOCAB_DIRECTORY)

# A tiny BERT for the training tests (BertConfig arguments), sized to the test vocabulary. One
# layer: these tests check the run (accumulation, clip, resume, logs), every layer runs the same
# code, and tests/test_model.py holds packed and unpacked equal through two layers. A second
# layer made every compile of a step about a third longer.
TINY = dict(vocab_size=len(VOCAB_TOKENS), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=MAX_SEQ_LENGTH)


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


def write_other_text(corpus_file, path):
    """Other text than a corpus file's, at `path`: its lines in the reverse order, as plain text
    without its <doc> lines."""
    lines = open(corpus_file, encoding="utf-8").read().splitlines(keepends=True)
    path.write_text("".join(line for line in reversed(lines) if not line.startswith(("<doc ", "</doc>"))))
    return path


@pytest.fixture(scope="session")
def other_text_dir(corpus, tmp_path_factory):
    """Unpacked records of other text than the training data's (the first corpus file's lines in
    the reverse order, as plain text without its <doc> lines): an eval set run_pretraining takes
    beside training on the corpus."""
    from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset

    root = tmp_path_factory.mktemp("other_text")
    text = write_other_text(corpus[0], root / "text.txt")
    directory = str(root / "records")
    create_pretraining_dataset([str(text)], directory, dataset_settings(), num_workers=1)
    return directory


@pytest.fixture(scope="session")
def packed_dir(unpacked_dir, tmp_path_factory):
    from bert_packed.features import Shapes
    from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset

    directory = str(tmp_path_factory.mktemp("packed"))
    files = sorted(os.path.join(unpacked_dir, n) for n in os.listdir(unpacked_dir) if n.endswith(".tfrecord"))
    settings = PackSettings(Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK), "lp", num_shards=2)
    pack_pretraining_dataset(inputs_of(files), directory, settings, num_workers=1)
    return directory


class ProcessStarted(AssertionError):
    """A test of the fast tier started a process."""


@pytest.fixture(autouse=True)
def _no_process_in_the_fast_tier(request, monkeypatch):
    """The fast tier starts no process: a test whose subject is a process (signals, kill -9,
    several workers, locks, a fresh interpreter, the wheel) is marked slow, and every other runs
    its commands in this process (run_command, run_script). Slow too, with its reason: a test
    that costs over 3.5 s here in steps compiled for it (or a solver)."""
    if request.node.get_closest_marker("slow") is None:
        def refuse(*args, **kwargs):
            raise ProcessStarted(f"{request.node.nodeid} starts a process: run it in this process (run_command, "
                                 f"run_script) or mark it slow")

        monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        monkeypatch.setattr(os, "fork", refuse)
        monkeypatch.setattr(os, "posix_spawn", refuse)
    yield


@pytest.fixture(scope="session", autouse=True)
def _no_graph_optimizer():
    """TensorFlow's graph optimizer (grappler) off in the test processes themselves: it rewrites
    each graph once to run it faster, and most tests run a compiled step a few times (the fast
    tier took 107 s without it against 128 s with it, in one sitting). What they run in this
    process runs without it: the main job, `make finetune` and the device check of the README
    and doctor tests too (the small main job, 250 updates and a throughput measurement, took 195 s
    against 185 s). The processes the tests start (the workers, kill -9, the locks, the disk-full
    runs, the eval command) keep it, as users run them. Set in a fixture, not on import: xdist's
    controller imports this file and runs no test."""
    from bert_packed.console.tensorflow_loading import import_tensorflow

    import_tensorflow().config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


# The tests' compiled steps, kept for the next test of their graph shape: the commands a test runs
# in this process take theirs from it too. A test's strategy serves its next runs (SEVERAL_REPLICAS).
STEPS = StepPool(strategies_kept=True)


@pytest.fixture(autouse=True)
def _release_compiled_steps():
    """After each test, the compiled steps it held may serve the next test of their graph shape
    (tests/training_runs.py also puts back the loops a test wrapped)."""
    yield
    runs = sys.modules.get("training_runs")
    (runs.release if runs is not None else STEPS.release)()


def tfrecords(directory):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".tfrecord"))


def inputs_of(paths):
    """The packer's input files, described as its command describes them (it opens them itself)."""
    from bert_packed.inputs.dataset import Dataset

    return Dataset.described(list(paths), "--input_files")


@pytest.fixture
def bert_config_file(tmp_path):
    """TINY as a google-research bert_config.json."""
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**TINY, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                                "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2,
                                "initializer_range": 0.02}))
    return str(path)


def command_in_this_process(command, cwd=REPO):
    """bert_packed.cli.in_process's, for a command of bert_packed/cli by its name."""
    from bert_packed.cli import in_process

    return in_process.command_in_this_process(f"bert_packed.cli.{command}", cwd)


def run_script(name, *args, cwd=REPO):
    """Runs scripts/<name>.py (one with an entry_point) in this process, as run_command runs a command."""
    scripts = os.path.join(REPO, "scripts")
    if scripts not in sys.path:
        sys.path.append(scripts)
    from bert_packed.cli.in_process import run_in_process

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_io = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    try:
        status = run_in_process(name, list(args), f"{name}.py", cwd, STEPS)
    finally:
        sys.stdout, sys.stderr = saved_io
    return subprocess.CompletedProcess([name, *args], status, stdout.getvalue(), stderr.getvalue())


def run_command(command, *args, cwd=REPO, launcher=None):
    """Runs a command (bert_packed/cli/<command>.py) in this process, as `python <command>.py
    args` runs in its own, and returns what running it in a subprocess returns: a
    CompletedProcess with the exit status, stdout and stderr.

    A new process that imports TensorFlow costs 3-4 s; this costs milliseconds, so the bad-input
    cases run here (each command still runs for real in a subprocess in some test marked slow).
    A bug is what the command makes of it: its traceback and a last line, exit status 1.

    launcher: a module that runs `command` by a name, its first argument, (bert_packed.cli.beam:
    `run_command("pack_pretraining_data", "pack", ..., launcher="beam")`).
    """
    from bert_packed.cli.in_process import call_entry_point

    stdout, stderr = io.StringIO(), io.StringIO()
    with command_in_this_process(command, cwd) as module:
        if launcher:
            module = importlib.import_module(f"bert_packed.cli.{launcher}")
        sys.stdout, sys.stderr = stdout, stderr  # put back on leaving
        status = call_entry_point(module, [f"{launcher or command}.py", *args], STEPS)
    return subprocess.CompletedProcess([command, *args], status, stdout.getvalue(), stderr.getvalue())
