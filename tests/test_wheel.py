"""The built wheel installs a working package: every subpackage imports and every console script
runs from a fresh virtual environment that does not see the source tree.

What the commands make is tested from the source tree, not again here: create in a subprocess
(tests/test_data_create.py), pack -> plan in this process (tests/test_data_pack.py).
"""

import os
import subprocess
import sys
import sysconfig
import venv

import pytest
import tomllib
from conftest import REPO

pytestmark = pytest.mark.slow  # builds a wheel and a virtual environment

SCRIPTS = {
    "bert-packed-create": "Create unpacked BERT pre-training TFRecords",
    "bert-packed-pack": "Pack unpacked BERT pre-training TFRecords",
    "bert-packed-plan": "Plan a packing from a length histogram",
    "bert-packed-train": "Pre-train BERT with the MLPerf recipe",
    "bert-packed-compare": "Compare training runs",
    "bert-packed-pick-eval": "Pick the MLPerf eval set",
    "bert-packed-export": "Export pre-trained weights where users fine-tune",
    "bert-packed-beam": "Data preparation on Apache Beam",
    "bert-packed-doctor": "Check the install",
    "bert-packed-vocab": "Build a WordPiece vocabulary for a corpus",
    "bert-packed-classifier": "Fine-tune BERT to classify (or score) text",
    "bert-packed-squad": "Fine-tune BERT to answer questions on a text",
}


def test_every_console_script_of_the_package_is_checked():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        assert set(tomllib.load(f)["project"]["scripts"]) == set(SCRIPTS)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment with the wheel installed (its bin directory)."""
    work = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(work / "dist"), REPO], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = os.listdir(work / "dist")
    environment = work / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "-q", str(work / "dist" / wheel)], capture_output=True, text=True,
                             timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    # The dependencies (NumPy, TensorFlow...) come from this environment, as a plain path: its .pth
    # files, among them the editable install's hook onto the source tree, are not processed.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return environment / "bin"


def run(bin_dir, cwd, *args):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def test_the_package_comes_from_the_wheel_with_every_subpackage(installed, tmp_path):
    result = run(installed, tmp_path, "python", "-c", "import bert_packed, bert_packed.records.reader, "
                 "bert_packed.pretraining_data.create_dataset, bert_packed.packing.pack_dataset, "
                 "bert_packed.training.input_pipeline, bert_packed.training.loop, bert_packed.storage.locks, "
                 "bert_packed.inputs.dataset_info; print(bert_packed.__file__)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().startswith(str(installed.parent)) and "site-packages" in result.stdout


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_prints_its_help(installed, tmp_path, script):
    result = run(installed, tmp_path, script, "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(SCRIPTS[script])
    # beam launches the data commands (they take the flags); the doctor takes none
    assert ("\nflags:\n  --" in result.stdout) == (script not in ("bert-packed-beam", "bert-packed-doctor"))


def test_the_commands_work_outside_the_checkout_with_the_packaged_vocabulary_and_configs(installed, tmp_path):
    """The wheel carries the default vocabulary and the configs: create runs from any directory."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The first sentence of a document.\nIts second sentence is here.\n\n"
                      "Another document starts.\nAnd it goes on for a while.\n")
    result = run(installed, tmp_path, "bert-packed-create", f"--input_file={corpus}", f"--output_dir={tmp_path / 'u'}",
                 "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=1", "--num_workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.exists(tmp_path / "u" / "metadata.json")
    packaged = run(installed, tmp_path, "python", "-c", "import bert_packed, os; resources = os.path.join("
                   "os.path.dirname(bert_packed.__file__), 'resources'); print(sorted(os.listdir(os.path.join("
                   "resources, 'configs')))[:2], os.path.getsize(os.path.join(resources, 'bert_uncased_vocab.txt')))")
    assert packaged.stdout.split() == ["['ablation_batch_corrected_schedule_in_sequences.cfg',",
                                       "'ablation_packed_depth1.cfg']", "231508"]



def test_make_keeps_the_tensorflow_an_environment_already_has(tmp_path):
    """The README's GPU install (`pip install -e '.[gpu,test]'`), then `make`: tensorflow-cpu is
    never installed over the `tensorflow` package's files (that loses the GPU silently)."""

    def planned(environment):
        result = subprocess.run(["make", "--no-print-directory", "-n", "test", f"VIRTUAL_ENV={environment}",
                                 f"STAMP={tmp_path / 'not-installed'}", f"TEST_STAMP={tmp_path / 'not-installed-test'}"],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines() if " -e " in line]

    for name, tensorflow in (("bare", None), ("gpu", "tensorflow"), ("tpu", "tf_nightly")):
        venv.EnvBuilder(with_pip=False).create(tmp_path / name)
        if tensorflow:
            site = subprocess.run([str(tmp_path / name / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            os.makedirs(os.path.join(site, f"{tensorflow}-2.21.0.dist-info"))
            with open(os.path.join(site, f"{tensorflow}-2.21.0.dist-info", "METADATA"), "w") as f:
                f.write(f"Metadata-Version: 2.1\nName: {tensorflow}\nVersion: 2.21.0\n")
    # The main job's needs first (make run stops there), then the tests'.
    for name, extra in (("bare", "cpu"), ("gpu", "train"), ("tpu", "train")):
        pip = f"{tmp_path / name}/bin/python -m pip install --quiet --quiet --no-compile -e"
        assert planned(tmp_path / name) == [f"{pip} '.[{extra}]'", f"{pip} '.[{extra},test]'"]
