"""The MLPerf eval set: a fixed number of samples picked from a larger file of eval instances.

MLPerf evaluates on 10,000 samples. They are made by create_pretraining_data from the held-out
text with seed 12345 (eval_intermediate), then picked as the reference's pick_eval_samples.py
picks them: of N records, record int(i * (N / n)) for i = 0..n-1, evenly spread and in order. The
same input gives the same n records, byte for byte.

    from bert_packed.pretraining_data.eval_samples import PickSettings, pick_eval_samples

    total = pick_eval_samples(PickSettings(input_tfrecord="runs/eval_intermediate", output_tfrecord="runs/eval_10k"))
"""

from __future__ import annotations

import dataclasses
import os

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import read_dataset_info, require_seq_length
from bert_packed.inputs.provenance import origins
from bert_packed.records import TFRecordWriter, read_record_batches, read_unpacked
from bert_packed.settings import check_settings, setting
from bert_packed.storage import files


@dataclasses.dataclass(frozen=True, kw_only=True)
class PickSettings:
    """pick_eval_samples's settings, the reference's flags, checked when built."""

    input_tfrecord: str | None = setting(None, "The eval instances (create_pretraining_data --output_file).",
                                         group="files")
    output_tfrecord: str | None = setting(None, "Where the picked records go (one TFRecord file).", group="files")
    num_examples_to_pick: int = setting(10000, "Records to pick (MLPerf evaluates on 10,000).", group="records")
    max_seq_length: int = setting(512, "L of the records.", group="records")
    max_predictions_per_seq: int = setting(76, "P of the records.", group="records")

    def __post_init__(self):
        check_settings(self)
        if self.num_examples_to_pick < 1:
            raise SettingsError(f"--num_examples_to_pick={self.num_examples_to_pick}: must be >= 1")
        require_seq_length(self.max_seq_length)
        if not 1 <= self.max_predictions_per_seq <= self.max_seq_length:
            raise SettingsError(f"--max_predictions_per_seq={self.max_predictions_per_seq}: must be from 1 to "
                                f"--max_seq_length={self.max_seq_length}")


def pick_eval_samples(settings: PickSettings) -> int:
    """Writes --num_examples_to_pick records of --input_tfrecord to --output_tfrecord (atomically);
    returns the records read.

    The output is one file with no metadata.json, so no later command can tell where its records
    came from: a training shard is refused (MLPerf never evaluates on what it trains on), and so
    is an output that is the input or a file of a described dataset. Every input record is checked
    for the MLPerf layout first (read_unpacked), so a bad one is named by file and record before
    anything is written.

    Args:
      settings: the command's settings; both files are required.

    Returns:
      How many records the input holds.

    Raises:
      SettingsError: a file not given, the input a training shard, the output the input or in a
        dataset's directory, or the input holding fewer records than are to be picked.
      RecordError / CorruptRecordError: a bad or truncated input record.
    """
    input_path, output_path, count = settings.input_tfrecord, settings.output_tfrecord, settings.num_examples_to_pick
    for flag, path in (("input_tfrecord", input_path), ("output_tfrecord", output_path)):
        if not path:
            raise SettingsError(f"--{flag}: not given; expected a TFRecord file's path")
    trained = next((o.file for o in origins([input_path])[input_path] if not o.held_out), None)
    if trained is not None:
        raise SettingsError(f"--input_tfrecord={input_path}: a training shard of {os.path.dirname(trained)} "
                            f"(its metadata.json): its records are trained on; pick from its held-out files "
                            f"(eval-*.tfrecord) or from records of held-out text")
    if files.absolute(output_path) == files.absolute(input_path):
        raise SettingsError(f"--output_tfrecord={output_path}: the input itself; write the picked records to a file "
                            f"of their own")
    if read_dataset_info(os.path.dirname(files.absolute(output_path))) is not None:
        raise SettingsError(f"--output_tfrecord={output_path}: in a dataset's directory (its metadata.json "
                            f"describes it); write the picked records elsewhere")
    shapes = Shapes(settings.max_seq_length, settings.max_predictions_per_seq)
    total = sum(len(batch["input_ids"]) for _, batch in read_unpacked(input_path, shapes))
    if total < count:
        raise SettingsError(f"{input_path}: holds {total} records, fewer than the {count} to pick "
                            f"(--num_examples_to_pick)")
    ratio = total / count  # the reference's arithmetic, so the same records are picked
    wanted = [int(i * ratio) for i in range(count)]
    picked, next_wanted = [], 0
    for first, data, starts, lengths in read_record_batches(input_path):
        while next_wanted < count and wanted[next_wanted] < first + len(starts):
            k = wanted[next_wanted] - first
            picked.append(data[starts[k]:starts[k] + lengths[k]])
            next_wanted += 1
    files.remove_leftovers(os.path.dirname(output_path) or ".", of=os.path.basename(output_path))  # a killed pick's
    with TFRecordWriter(output_path) as writer:
        writer.write_all(picked)
    return total
