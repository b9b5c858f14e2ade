"""Every fenced bash and python block of the README and of the guides in docs/ runs as written.

The blocks run in page order (the README first, then docs/ by name) in a checkout-like directory
(the repository's configs, data and scripts; .venv is this environment) after the state
`make run` leaves is made small: the sample's records at L=512 with held-out documents, packed,
and phase-1 weights. Only sizes change: the lines below in SMALLER, nothing else. The set-up
lines (`make ...`) are the ones not run here: `make test` is this suite, and `make run` takes
minutes.
"""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, write_corpus

README = os.path.join(REPO, "README.md")
PAGES = [README] + sorted(os.path.join(REPO, "docs", name) for name in os.listdir(os.path.join(REPO, "docs"))
                          if name.endswith(".md"))
SET_UP = {"make run", "make test", "make experiments"}
# README sizes -> test sizes.
SMALLER = [
    (re.compile(r"--dupe_factor=10\b"), "--dupe_factor=1"),
    (re.compile(r"(run_pretraining\.py --flagfile=\S+)"), r"\1 --num_train_steps=2"),
]


def fenced_blocks(page: str = README) -> list[tuple[int, str, str]]:
    """(line number, language, text) of every fenced block of a page."""
    blocks, language, start, lines = [], None, 0, []
    with open(page, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                if language is None:
                    language, start, lines = line[3:].strip(), number, []
                else:
                    blocks.append((start, language, "".join(lines)))
                    language = None
            elif language is not None:
                lines.append(line)
    return blocks


def without_set_up(script: str) -> str:
    kept = []
    for line in script.splitlines():
        command = line.split("#", 1)[0].strip()
        if command in SET_UP:
            continue
        assert not command.startswith("make "), f"README: `{command}` is neither run here nor a set-up command"
        kept.append(line)
    return "\n".join(kept) + "\n"


def smaller(script: str) -> str:
    for pattern, replacement in SMALLER:
        script = pattern.sub(replacement, script)
    return script


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A directory laid out as a clone after `make run`, with small data."""
    from bert_packed.features import Shapes
    from bert_packed.model import BertConfig, BertPretrainingModel, export_google_checkpoint
    from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
    from bert_packed.pretraining_data.create_dataset import DatasetSettings, create_pretraining_dataset
    from bert_packed.pretraining_data.instances import MaskingConfig

    root = tmp_path_factory.mktemp("checkout")
    for name in ("configs", "data", "scripts", "run_pretraining.py"):
        os.symlink(os.path.join(REPO, name), root / name)
    os.symlink(sys.prefix, root / ".venv")
    sample = root / "runs" / "sample"
    corpus = write_corpus(str(tmp_path_factory.mktemp("corpus")), num_files=2, docs_per_file=10)
    settings = DatasetSettings(os.path.join(REPO, "data", "bert_uncased_vocab.txt"), True,
                               MaskingConfig(512, 76), 1, 12345, eval_fraction=0.3)
    create_pretraining_dataset(corpus, str(sample / "unpacked"), settings, num_workers=1)
    parts = sorted(str(path) for path in (sample / "unpacked").glob("part-*.tfrecord"))
    pack_pretraining_dataset(parts, str(sample / "packed"), PackSettings(Shapes(512, 76, 3), "lp"), num_workers=1)
    model = BertPretrainingModel(BertConfig.from_json_file(os.path.join(REPO, "configs", "bert_config_tiny.json")))
    os.makedirs(sample / "phase1")
    export_google_checkpoint(model, str(sample / "phase1" / "model.ckpt-250"))
    return root


def test_the_pages_have_their_set_up_commands_and_no_placeholder():
    commands = {line.split("#")[0].strip() for page in PAGES for _, language, text in fenced_blocks(page)
                if language == "bash" for line in text.splitlines()}
    assert commands >= SET_UP
    readme = {line.split("#")[0].strip() for _, language, text in fenced_blocks() if language == "bash"
              for line in text.splitlines()}
    assert {"make run", "make test"} <= readme
    for page in PAGES:
        for start, language, text in fenced_blocks(page):
            where = f"{os.path.relpath(page, REPO)} line {start}"
            assert language in ("bash", "python", "text"), f"{where}: a block without a language"
            for placeholder in ("path/to", "<", "..."):
                assert language == "text" or placeholder not in text, f"{where}: placeholder {placeholder!r}"


def test_the_readme_is_a_front_page():
    with open(README, encoding="utf-8") as f:
        assert len(f.read()) <= 12_000


@pytest.mark.slow
def test_every_readme_block_runs_as_written(checkout):
    # As after `source .venv/bin/activate` (a block of its own, which cannot carry over to the next).
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "VIRTUAL_ENV": sys.prefix,
                   "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    ran = 0
    for page in PAGES:
        for start, language, text in fenced_blocks(page):
            if language == "bash":
                command = ["bash", "-euo", "pipefail", "-c", smaller(without_set_up(text))]
            elif language == "python":
                command = [sys.executable, "-c", text]
            else:
                continue
            result = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600,
                                    env=environment)
            where = f"{os.path.relpath(page, REPO)} line {start}"
            assert result.returncode == 0, f"{where}:\n{text}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
            ran += 1
    assert ran >= 8
