"""The commands' settings as a notebook builds them (bert_packed.settings): each value of its
flag's type whatever Python gave (NumPy's numbers, pathlib's paths, lists), and each refusal a
SettingsError naming the setting, before any file is read."""

import dataclasses
import json
import math

import numpy as np
import pytest

from bert_packed.errors import SettingsError
from bert_packed.model.config import ExportSettings
from bert_packed.packing.pack_settings import PackCommandSettings, PlanSettings
from bert_packed.reports.comparison import CompareSettings
from bert_packed.training.assemble import PretrainingSettings
from bert_packed.training.finetune_settings import ClassifierSettings, SquadSettings


def test_numpy_numbers_paths_and_lists_become_the_flags_types(tmp_path):
    """json (run.json, metadata.json) refused NumPy's integers after the work had begun."""
    pack = PackCommandSettings(input_files=tmp_path / "part-*.tfrecord", output_dir=tmp_path / "packed",
                               max_sequences_per_pack=np.int64(2), seed=np.uint32(7))
    assert (pack.input_files, pack.output_dir) == (str(tmp_path / "part-*.tfrecord"), str(tmp_path / "packed"))
    assert (type(pack.max_sequences_per_pack), type(pack.seed)) == (int, int)
    assert json.loads(json.dumps({**dataclasses.asdict(pack), "given": []}))["max_sequences_per_pack"] == 2
    run = PretrainingSettings.of(bert_config_file=tmp_path / "bert_config.json", output_dir=tmp_path / "run",
                                 train_batch_size=np.int64(4), learning_rate=np.float32(0.5))
    assert run["output_dir"] == str(tmp_path / "run") and run["bert_config_file"] == str(tmp_path / "bert_config.json")
    assert (type(run["train_batch_size"]), type(run["learning_rate"])) == (int, float)
    assert (run["train_batch_size"], run["learning_rate"]) == (4, 0.5)
    assert PlanSettings(histogram=tmp_path / "histogram.json", max_sequences_per_pack=np.int64(4)).depth == 4
    boundaries = PretrainingSettings.of(bucket_boundaries=[np.int64(128), "256"])["bucket_boundaries"]
    assert boundaries == [128, "256"] and type(boundaries[0]) is int  # strings as the command line gives them
    compare = CompareSettings(runs=[tmp_path / "a", "b"], labels=[tmp_path / "one", "two"], accuracy=0.5)
    assert (compare.runs, compare.labels, compare.accuracy) == ((str(tmp_path / "a"), "b"), (str(tmp_path / "one"), "two"),
                                                                "0.5")


SQUAD = dict(train_file="train.json", do_train=True, bert_config_file="bert_config.json", output_dir="out")
CLASSIFIER = dict(task_name="mrpc", data_dir="glue", bert_config_file="bert_config.json", output_dir="out",
                  do_train=True)


@pytest.mark.parametrize("make, message", [
    (lambda: PackCommandSettings(input_files="part-*.tfrecord"), "--output_dir is required"),
    (lambda: PackCommandSettings(output_dir="packed"), "--input_files is required"),
    (lambda: PackCommandSettings(input_files="x", output_dir="y", num_workers=-1), "--num_workers=-1: must be >= 0"),
    (lambda: PackCommandSettings(input_files="x", output_dir="y", bucket_mb=0), "--bucket_mb=0: must be >= 1"),
    (lambda: ExportSettings(bert_config_file="c.json", output_dir="out"), "--checkpoint is required"),
    (lambda: ExportSettings(checkpoint="run", output_dir="out"), "--bert_config_file is required"),
    (lambda: ExportSettings(checkpoint="run", bert_config_file="c.json", output_dir=""), "--output_dir is required"),
    (lambda: ClassifierSettings(**CLASSIFIER, eval_batch_size="8"), "--eval_batch_size='8': a str; expected an integer"),
    (lambda: ClassifierSettings(**CLASSIFIER, predict_batch_size=None), "--predict_batch_size: None; expected an integer"),
    (lambda: SquadSettings(**SQUAD, doc_stride="128"), "--doc_stride='128': a str; expected an integer"),
    (lambda: SquadSettings(**SQUAD, max_seq_length="384"), "--max_seq_length='384': a str; expected an integer"),
    (lambda: SquadSettings(**SQUAD, max_query_length=None), "--max_query_length: None; expected an integer"),
    (lambda: CompareSettings(runs="runs/a"), "runs='runs/a': expected a list of run directories"),
    (lambda: CompareSettings(runs=["a"], at_sequences=-5.0), "--at_sequences=-5.0: expected a number of sequences"),
    (lambda: CompareSettings(runs=["a"], at_sequences=math.nan), "--at_sequences=nan: expected a number of sequences"),
    (lambda: CompareSettings(runs=["a"], accuracy=True), "--accuracy=True: a bool; expected a string"),
    (lambda: CompareSettings(runs=["a"], accuracy=math.nan), "--accuracy 'nan': expected a number at least 0"),
    (lambda: CompareSettings(runs=[None]), "runs=[None]: expected a list of run directories"),
    (lambda: CompareSettings(runs=[b"run"]), "runs=[b'run']: expected a list of run directories"),
    (lambda: CompareSettings(runs=["a"], labels=[1]), "--labels=[1]: 1 is a int; expected a list of strings"),
    (lambda: PretrainingSettings.of(bucket_boundaries=None), "--bucket_boundaries: None; expected a list of integers"),
    (lambda: PretrainingSettings.of(bucket_boundaries=[128.5]),
     "--bucket_boundaries=[128.5]: 128.5 is a float; expected a list of integers"),
    (lambda: ClassifierSettings(**CLASSIFIER, seed=2**70), f"--seed={2**70}: expected 0 to 2**32 - 1"),
])
def test_a_notebook_s_mistake_is_a_settings_error_naming_the_setting(make, message):
    """Each was a TypeError or AttributeError from deep inside (a comparison before the type
    check, a None joined to a path), or a wrong run: a string's characters taken as run names."""
    with pytest.raises(SettingsError) as refused:
        make()
    assert str(refused.value).startswith(message)
