import atexit
import contextlib
import importlib
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from absl import app, command_name, flags
from absl import logging as absl_logging
from absl.testing import flagsaver

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


# The files that take longest, longest first: the two test processes (pytest-xdist, one file
# each at a time) start them first, so that neither is left alone with a long file at the end.
# xdist gives a process its next file once two or fewer of its tests are left to run, which for
# the README's file (two short tests, then the main job and its blocks, about a third of the
# suite) is at once: the 3rd file waits behind it, so a short one comes 3rd.
LONGEST_FIRST = ("test_readme.py", "test_resume.py", "test_layout.py", "test_trainer.py", "test_trajectory.py",
                 "test_reference.py", "test_locks.py", "test_throughput.py", "test_storage.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = os.path.basename(str(item.path))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order


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
    pack_pretraining_dataset(files, directory, settings, num_workers=1)
    return directory


@pytest.fixture(autouse=True)
def _release_compiled_steps():
    """After each test, the compiled steps it held may serve the next test of their graph shape
    (tests/training_runs.py; loaded only by the tests that train)."""
    yield
    runs = sys.modules.get("training_runs")
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


@contextlib.contextmanager
def command_in_this_process(command, cwd=REPO):
    """Sets this process up as a fresh one about to run a command (bert_packed/cli/<command>.py),
    yields the command's module, and puts back afterwards everything a command changes in the
    process, so that the next test sees nothing of it.

    What is put back: absl's flags (their values, parsed or not, and which are defined: the
    commands define flags of the same names, which cannot be defined twice, so those of the other
    commands are taken out meanwhile), absl's run-once state, and what _process_state_kept keeps.
    """
    FLAGS = flags.FLAGS
    module_name = f"bert_packed.cli.{command}"
    app.define_help_flags()  # once per process: part of what is saved below, not defined by the command
    with _process_state_kept():  # put back last: restoring --verbosity sets the absl logger's level
        registries = (FLAGS.flags_by_module_dict(), FLAGS.flags_by_module_id_dict(), FLAGS.key_flags_by_module_dict())
        saved_flags = {name: FLAGS[name] for name in FLAGS}
        saved_registries = [{key: list(value) for key, value in registry.items()} for registry in registries]
        saved_values = flagsaver.save_flag_values(FLAGS)
        was_parsed = FLAGS.is_parsed()
        was_imported = module_name in sys.modules
        run_once = (app._run_init.done, app._register_and_parse_flags_with_usage.done)
        process_name = command_name.make_process_name_useful
        try:
            # The other commands' flags out of the way; every flag at its default and unparsed, as in
            # a new process; absl's one-time set-up (in app.run) to be done again.
            for name in list(FLAGS):
                defined_by = FLAGS.find_module_defining_flag(name, "")
                if defined_by.startswith("bert_packed.cli.") and defined_by != module_name:
                    delattr(FLAGS, name)
            FLAGS.unparse_flags()
            app._run_init.done = app._register_and_parse_flags_with_usage.done = False
            command_name.make_process_name_useful = lambda: None  # the test process keeps its name
            os.chdir(cwd)
            yield importlib.import_module(module_name)
        finally:
            # The flags as they were: the command's own taken out (unless defined before), the others back.
            if not was_imported:
                sys.modules.pop(module_name, None)
            for name in list(FLAGS):
                if saved_flags.get(name) is not FLAGS[name]:
                    delattr(FLAGS, name)
            for name, flag in saved_flags.items():
                if name not in FLAGS:
                    FLAGS[name] = flag
            for registry, saved in zip(registries, saved_registries):
                registry.clear()
                registry.update(saved)
            FLAGS.unparse_flags()
            flagsaver.restore_flag_values(saved_values, FLAGS)
            if was_parsed:
                FLAGS.mark_as_parsed()
            app._run_init.done, app._register_and_parse_flags_with_usage.done = run_once
            command_name.make_process_name_useful = process_name


@contextlib.contextmanager
def _process_state_kept():
    """Puts back the logging set-up (levels, handlers, and the absl handler's stream, formatter and
    filters), the SIGINT and SIGTERM handlers, sys.argv, sys.stdout and sys.stderr, the environment
    and the working directory."""
    handler = absl_logging.get_absl_handler()
    saved_handler = (handler.python_handler.stream, handler.python_handler.formatter, list(handler.filters))
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    saved_loggers = [(logger, logger.level, list(logger.handlers)) for logger in loggers]
    saved_signals = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    saved_io = (sys.argv, sys.stdout, sys.stderr)
    saved_environment = dict(os.environ)
    saved_directory = os.getcwd()
    try:
        yield
    finally:
        os.chdir(saved_directory)
        os.environ.clear()
        os.environ.update(saved_environment)
        sys.argv, sys.stdout, sys.stderr = saved_io
        for number, saved in saved_signals.items():
            signal.signal(number, saved)
        stream, formatter, filters = saved_handler
        handler.python_handler.stream = stream
        handler.setFormatter(formatter)
        handler.filters[:] = filters
        for logger, level, handlers in saved_loggers:
            logger.setLevel(level)
            logger.handlers[:] = handlers


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
    stdout, stderr = io.StringIO(), io.StringIO()
    with command_in_this_process(command, cwd) as module:
        if launcher:
            module = importlib.import_module(f"bert_packed.cli.{launcher}")
        sys.argv = [f"{launcher or command}.py", *args]
        sys.stdout, sys.stderr = stdout, stderr
        absl_logging.get_absl_handler().python_handler.stream = stderr  # it holds the stderr of its creation
        try:
            module.entry_point()
            status = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                status = e.code or 0
            else:  # as Python exits on a message: printed, status 1
                stderr.write(f"{e.code}\n")
                status = 1
    return subprocess.CompletedProcess([command, *args], status, stdout.getvalue(), stderr.getvalue())
