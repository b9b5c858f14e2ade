"""What run_pretraining builds from its settings before it touches a device: the run's settings
(TrainConfig), its training data and its eval data, each described and checked against the
others. run_pretraining's settings are every flag's value by name and which were given
(PretrainingSettings: the command line's, or a notebook's PretrainingSettings.of(...)); anything
else that starts a run the way the command does (a test, a benchmark) calls the same assemble().
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.input_files import expand_globs
from bert_packed.settings import check_setting, settings_of
from bert_packed.storage.run_directory import RunDirectory
from bert_packed.training.config import PARTS, LaunchSettings, TrainConfig, make_config, setting_names
from bert_packed.training.launch import DistributionSettings

if TYPE_CHECKING:  # training.data reads records through tf.data: imported when a run is assembled
    from bert_packed.training.data import EvalData, TrainData


@dataclasses.dataclass(frozen=True)
class PretrainingSettings:
    """run_pretraining's settings: every value by its flag's name, and the names of those given (a
    flag not given takes its default; the reference's second spellings and the data's recorded
    shapes count only when given). `PretrainingSettings.of(output_dir=..., ...)` gives some."""

    values: Mapping[str, object]
    given: frozenset[str]

    @classmethod
    def of(cls, **given) -> PretrainingSettings:
        """The settings that give `given` (by their flags' names) and leave every other at its
        default, as run_pretraining parses its command line: how a notebook, a benchmark or a test
        starts a run the command's way."""
        defaults = {field.name: list(field.default) if isinstance(field.default, tuple) else field.default
                    for field in settings_of(LaunchSettings, DistributionSettings, *PARTS.values())}
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise SettingsError(f"--{unknown[0]}: run_pretraining has no such setting")
        values = dict(defaults)
        for field in settings_of(LaunchSettings, DistributionSettings, *PARTS.values()):
            if field.name in given:
                checked = check_setting(field, given[field.name])  # a NumPy integer as an int, a Path as a str
                values[field.name] = list(checked) if isinstance(checked, tuple) else checked  # as its flag gives
        return cls(values, frozenset(given))

    def __getitem__(self, name: str):
        return self.values[name]

    def spelled(self, ours: str, reference: str, convert=lambda value: value):
        """The value of a setting that has two flag names (ours and the reference's); both given
        must agree.

        Args:
          ours, reference: the two flag names.
          convert: maps the reference flag's value to ours (log_epsilon -> epsilon, say).
        """
        if reference not in self.given:
            return self[ours]
        value = convert(self[reference])
        same = math.isclose(value, self[ours]) if isinstance(value, float) else value == self[ours]
        if ours in self.given and not same:
            raise SettingsError(f"--{ours}={self[ours]} and --{reference}={self[reference]} disagree; give one of them")
        return value

    def distribution(self) -> DistributionSettings:
        """The devices and hosts the run trains on (the distribution flags), checked."""
        names = [field.name for field in settings_of(DistributionSettings)]
        return DistributionSettings(**{name: self[name] for name in names}, given=self.given & set(names))


def check_reference_flags(line: PretrainingSettings) -> None:
    """The reference flags that cannot be honoured here, named."""
    if not line["do_train"] and not line["do_eval"]:
        raise SettingsError("--do_train and --do_eval are both false: nothing to do")
    line.distribution()


def _power_of_ten(log_epsilon: float) -> float:
    if not -300 <= log_epsilon <= 300:
        raise SettingsError(f"--log_epsilon={log_epsilon}: epsilon is 10**log_epsilon, expected about -6")
    return 10.0 ** log_epsilon


def _lengths(bucket_boundaries: list[str]) -> tuple[int, ...]:
    try:
        return tuple(int(length) for length in bucket_boundaries)
    except ValueError:
        raise SettingsError(f"--bucket_boundaries={','.join(bucket_boundaries)}: expected lengths separated by "
                            f"commas (--bucket_boundaries=128,256,384)") from None


def assemble(line: PretrainingSettings, flags_text: str = "") -> tuple[TrainConfig, TrainData, EvalData]:
    """The run's settings, its training data and its eval data: every setting from the flag of its
    name (the parts check themselves), then the data described and checked against the settings
    (no device is touched).

    Args:
      line: the command line's flags.
      flags_text: the command line as a flagfile, recorded in the run's flags.txt.
    """
    from bert_packed.model import BertConfig
    from bert_packed.model.huggingface import is_huggingface_directory, require_export_directory, require_same_model
    from bert_packed.pretraining_data.tokenization import vocabulary_path

    check_reference_flags(line)
    if not line["bert_config_file"]:  # a required flag: a caller from Python meets this
        raise SettingsError("--bert_config_file is required")
    input_pattern = line.spelled("input_files", "input_file")
    if not input_pattern:
        raise SettingsError("--input_file (or --input_files) is required")
    input_files = expand_globs(input_pattern, "--input_file")
    settings = {name: line[name] for name in setting_names() if name in line.values}
    config = make_config(**{**settings, "bert": BertConfig.from_json_file(line["bert_config_file"]),
                            "vocab_file": vocabulary_path(line["vocab_file"]),
                            "epsilon": line.spelled("epsilon", "log_epsilon", _power_of_ten),
                            "bucket_boundaries": _lengths(line["bucket_boundaries"]),
                            "flags_text": flags_text})
    if config.model.init_checkpoint and is_huggingface_directory(config.model.init_checkpoint):
        require_same_model(config.model.init_checkpoint, config.model.bert)
    if config.run.export_huggingface_dir:
        require_export_directory(config.run.export_huggingface_dir, config.run.vocab_file, config.run.do_lower_case,
                                 config.model.bert, config.run.output_dir)
    return (config, *_run_data(line, config, input_files))


def _run_data(line: PretrainingSettings, config: TrainConfig, input_files: list[str]) -> tuple[TrainData, EvalData]:
    """The training data and the eval data of a run, described, checked against its settings and
    opened: what `line`'s files are (--input_file, --eval_files) and how they are read."""
    from bert_packed.inputs import provenance
    from bert_packed.training import data

    # Each set of files read is described once: trained on, or evaluated (--input_file evaluated
    # too with --do_eval alone, as in the reference: opened again there, as an eval set).
    inputs = Dataset.described(input_files, "--input_file") if line["do_train"] or not line["eval_files"] else None
    evaluation = inputs if line["do_eval"] else None
    if line["eval_files"]:
        evaluation = Dataset.described(expand_globs(line["eval_files"], "--eval_files"), "--eval_files")
    # L and P as given, else as the data read records them; an eval set without a description of
    # its own (the reference's) is read at --input_file's, as before the eval set could say.
    described = inputs if line["do_train"] else evaluation
    if described.shapes is None and inputs is None:
        described = Dataset.described(input_files, "--input_file")
    given = [line[name] if name in line.given else None for name in ("max_seq_length", "max_predictions_per_seq")]
    shapes = Shapes(*described.lengths(*given, defaults=(LaunchSettings.max_seq_length,
                                                         LaunchSettings.max_predictions_per_seq)),
                    line["max_sequences_per_pack"])
    if line["do_train"]:
        train_data = data.train_data(inputs, shapes, config, "max_sequences_per_pack" in line.given,
                                     line["train_on_held_out_files"], RunDirectory(config.run.output_dir))
    else:  # evaluation alone
        train_data = data.TrainData(shapes.unpacked(), "padded")
    if line["do_train"] and line["do_eval"] and not line["eval_files"]:
        logging.warning("--do_eval without --eval_files evaluates on the training files, as the reference does: "
                        "its accuracy is not a held-out one (MLPerf never evaluates on what it trains on); give "
                        "--eval_files")
    if evaluation is None:
        return train_data, data.EvalData()
    if line["do_train"] and line["eval_files"]:
        provenance.require_eval_apart(inputs, evaluation, "--eval_files")
    return train_data, data.eval_data(evaluation, shapes, config)
