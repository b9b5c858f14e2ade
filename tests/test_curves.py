import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_command

from bert_packed.reports.comparison import plot, target_note, throughput_lines, verdict_notes
from bert_packed.reports.curves import (
    RunError,
    above_the_packing_factor,
    automatic_accuracy,
    configuration_name,
    format_table,
    group_runs,
    load_run,
    summary_table,
    value_at,
)
from bert_packed.reports.speedups import describe_speedup


def write_run(directory, mode, packing_factor, seconds_per_step, sequences_per_step, accuracies):
    os.makedirs(directory)
    with open(os.path.join(directory, "train_log.jsonl"), "w") as f:
        for step in range(1, 11):
            f.write(json.dumps({"step": step, "sequences": step * sequences_per_step, "seconds": step * seconds_per_step,
                                "loss": 10.0 - step * 0.1, "mlm_accuracy": step / 100, "real_tokens": 1000.0,
                                "learning_rate": 1e-3}) + "\n")
    with open(os.path.join(directory, "eval_log.jsonl"), "w") as f:
        for i, accuracy in enumerate(accuracies, start=1):
            f.write(json.dumps({"step": 5 * i, "sequences": 5 * i * sequences_per_step,
                                "seconds": 5 * i * seconds_per_step, "loss": 9.0, "mlm_accuracy": accuracy}) + "\n")
    with open(os.path.join(directory, "run.json"), "w") as f:
        json.dump({"input_mode": mode, "packing_factor": packing_factor}, f)
    return str(directory)


def test_table_measures_time_to_accuracy_and_speedups(tmp_path):
    padded = write_run(tmp_path / "padded", "padded", 1.0, 2.0, 8, [0.2, 0.4])
    packed = write_run(tmp_path / "packed", "packed", 2.0, 2.0, 16, [0.4, 0.5])
    rows = summary_table([load_run(padded), load_run(packed)], accuracy=0.4)
    assert rows[0]["seconds_to_accuracy"] == 20.0 and rows[0]["sequences_to_accuracy"] == 80
    assert rows[1]["seconds_to_accuracy"] == 10.0 and rows[1]["sequences_to_accuracy"] == 80
    assert rows[1]["throughput_speedup"] == pytest.approx(2.0)
    assert rows[1]["time_to_accuracy_speedup"] == pytest.approx(2.0)
    assert rows[1]["speedup_over_packing_factor"] == pytest.approx(1.0)
    assert rows[1]["final_accuracy"] == 0.5


def test_verdicts_that_cannot_mislead(tmp_path):
    """No automatic target a run meets at its first evaluation (curves that never rose gave a
    time-to-accuracy speed-up of 1.30); a clock speed-up above the packing factor is marked and
    said why it may be, not called impossible; one seed cannot tell a gap from seed noise."""
    padded = load_run(write_run(tmp_path / "padded", "padded", 1.0, 2.0, 8, [0.2, 0.4]))
    packed = load_run(write_run(tmp_path / "packed", "packed", 1.2, 1.0, 12, [0.4, 0.4]))  # met at once, flat
    assert automatic_accuracy([padded, packed]) is None
    rows = summary_table([padded, packed], None)
    assert rows[1]["time_to_accuracy_speedup"] is None and rows[1]["sequences_to_accuracy"] is None
    # 12 sequences a second against the padded run's 4, at a packing factor of 1.2: 3.0x
    assert rows[1]["throughput_speedup"] == pytest.approx(3.0) and above_the_packing_factor(rows[1], rows[0])
    table = format_table(rows, None)
    assert "| sequences to target | seconds to target |" in table and "| 3.00 (above the packing factor) |" in table
    assert target_note([padded, packed], rows, None, True) == (
        "no time-to-accuracy figure: no accuracy is above every run's first evaluation and below every run's final "
        "one (the highest first 0.4000, the lowest final 0.4000: curves flat, or not overlapping), so no target tells "
        "the runs apart (--accuracy=auto); train longer, or give --accuracy")
    bucketed = dict(rows[1], input_mode="bucketed")  # shorter rows: another bound, not judged
    assert not above_the_packing_factor(bucketed, rows[0])
    assert verdict_notes(rows) == [
        "packed: a speed-up by the runs' clocks above the packing factor (marked so), more than packing saves: on a "
        "CPU fewer rows may fit its caches better and share an update's fixed cost; a round's clock is noisy; the "
        "runs' clocks are single measurements (clock_note)",
        "every configuration has one seed: a gap between curves cannot be told from seed noise; make experiments "
        "runs three seeds of each configuration and five of the baseline, for bands"]
    seeds = [load_run(write_run(tmp_path / f"padded_seed{i}", "padded", 1.0, 2.0, 8, [0.2, 0.4])) for i in (1, 2)]
    rising = load_run(write_run(tmp_path / "rising", "packed", 2.0, 2.0, 16, [0.3, 0.5]))
    assert automatic_accuracy(seeds + [rising]) == pytest.approx(0.39)
    rows = summary_table(seeds + [rising], 0.39)
    assert not above_the_packing_factor(rows[1], rows[0]) and "above the packing" not in format_table(rows, 0.39)
    assert verdict_notes(rows) == [
        "rising has one seed: a gap between curves cannot be told from seed noise; make experiments runs three seeds "
        "of each configuration and five of the baseline, for bands"]


def test_seeds_of_a_configuration_are_one_row_with_their_mean_and_range(tmp_path):
    assert configuration_name("packed_batch_corrected_seed12") == "packed_batch_corrected"
    assert configuration_name("seedless") == "seedless"
    runs = [load_run(write_run(tmp_path / f"unpacked_seed{i}", "padded", 1.0, 2.0, 8, accuracies))
            for i, accuracies in enumerate([[0.20, 0.40], [0.30, 0.44], [0.25, 0.42]], 1)]
    # Packed evaluates at other sequence counts (12 an update): its curve is read at the baseline's.
    runs += [load_run(write_run(tmp_path / f"packed_seed{i}", "packed", 1.5, 2.0, 12, accuracies))
             for i, accuracies in enumerate([[0.30, 0.46], [0.34, 0.50]], 1)]
    rows = summary_table(runs, accuracy=0.4)
    assert [(r["run"], r["seeds"]) for r in rows] == [("unpacked", 3), ("packed", 2)]
    assert rows[0]["final_accuracy"] == pytest.approx((0.40 + 0.44 + 0.42) / 3)
    assert rows[0]["final_accuracy_range"] == (0.40, 0.44)
    assert rows[0]["sequences_to_accuracy"] == 80 and rows[0]["sequences_to_accuracy_range"] == (80, 80)
    assert rows[1]["sequences_to_accuracy"] == 120  # 0.46 and 0.50 at their second evaluation
    assert rows[1]["throughput_speedup"] == pytest.approx(1.5)
    assert rows[1]["speedup_over_packing_factor"] == pytest.approx(1.0)
    # The baseline evaluates at 40 and 80 sequences. Packed's mean curve (evaluations at 60 and 120)
    # starts at 60, so only 80 is compared: 0.32 + (0.48 - 0.32) * 20 / 60 = 0.3733, below 0.40.
    # Within one update (12 sequences) of its first or last evaluation a run reads as that one.
    packed = runs[3]
    assert [value_at(packed, "mlm_accuracy", s) for s in (50, 47, 130)] == [0.30, None, 0.46]
    assert value_at(packed, "mlm_accuracy", 90) == pytest.approx(0.38)
    verdict = rows[1]["inside_baseline_spread"]
    assert (verdict["inside"], verdict["below"], verdict["above"], verdict["compared"]) == (0, 1, 0, 1)
    assert verdict["most_below"] == pytest.approx(0.40 - (0.32 + 0.16 / 3)) and verdict["left_out"] == []
    assert rows[0]["inside_baseline_spread"] is None
    table = format_table(rows, 0.4)
    assert "| unpacked | 3 | padded | 1.000 | 8.0 | 0.4200 (0.4000-0.4400) |" in table
    assert "| inside at 0 of 1; below at 1, by up to 0.02667 |" in table
    plot(runs, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def write_fine_tuning_run(directory, mode, accuracies, chance_accuracy=0.5):
    """A run_classifier run: accuracies at 4 evaluations, the dev set's commonest class at `chance_accuracy`."""
    os.makedirs(directory)
    with open(os.path.join(directory, "train_log.jsonl"), "w") as f:
        for step in range(1, 9):
            f.write(json.dumps({"step": step, "sequences": 8 * step, "seconds": step, "loss": 0.7, "real_tokens": 100.0,
                                "learning_rate": 1e-3}) + "\n")
    with open(os.path.join(directory, "eval_log.jsonl"), "w") as f:
        for i, accuracy in enumerate(accuracies, start=1):
            loss = 0.6932 if accuracy == chance_accuracy else 0.3
            f.write(json.dumps({"step": 2 * i, "sequences": 16 * i, "seconds": 2 * i, "loss": loss, "accuracy": accuracy,
                                "chance_loss": 0.6931, "chance_accuracy": chance_accuracy}) + "\n")
    with open(os.path.join(directory, "run.json"), "w") as f:
        json.dump({"input_mode": mode, "packing_factor": 1.0 if mode == "padded" else 4.0, "task_name": "jsonl"}, f)
    return str(directory)


def test_a_run_at_chance_is_marked_and_left_out_of_the_seed_ranges(tmp_path):
    """A collapsed padded seed (0.50 throughout) widened the range to 0.50-0.99 and put packed
    "inside 8/8"; left out, packed is above the other seeds' range, and by how much is said."""
    padded = [write_fine_tuning_run(tmp_path / f"padded_seed{i}", "padded", accuracies) for i, accuracies in
              enumerate([[0.70, 0.80, 0.85, 0.90], [0.72, 0.82, 0.86, 0.91], [0.5, 0.5, 0.5, 0.5]], 1)]
    packed = [write_fine_tuning_run(tmp_path / f"packed_seed{i}", "packed", accuracies) for i, accuracies in
              enumerate([[0.75, 0.85, 0.95, 0.97], [0.74, 0.84, 0.94, 0.98]], 1)]
    runs = [load_run(path) for path in padded + packed]
    rows = summary_table(runs, None)
    assert rows[0]["at_chance"] == ["padded_seed3"] and rows[1]["at_chance"] == []
    verdict = rows[1]["inside_baseline_spread"]
    assert verdict["left_out"] == ["padded_seed3"] and verdict["compared"] == 4 and verdict["inside"] == 0
    assert verdict["above"] == 4 and verdict["most_above"] == pytest.approx(0.945 - 0.86)  # the third evaluation
    table = format_table(rows, None)
    assert "| padded (at chance: padded_seed3) | 3 |" in table
    assert "| inside at 0 of 4; above at 4, by up to 0.08500 (padded_seed3 at chance: left out) |" in table
    assert any(note.startswith("padded_seed3: at chance for the second half of its evaluations, learned nothing")
               and "--learning_rate" in note for note in verdict_notes(rows))
    learning = write_fine_tuning_run(tmp_path / "late", "padded", [0.5, 0.5, 0.6, 0.7])  # at chance early only
    assert load_run(learning).evals and summary_table([load_run(learning)], None)[0]["at_chance"] == []


def test_configurations_are_told_apart_by_path_and_checked_for_agreeing_settings(tmp_path):
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    first = load_run(write_run(tmp_path / "a" / "packed_seed1", "packed", 1.5, 2.0, 12, [0.3, 0.4]))
    second = load_run(write_run(tmp_path / "b" / "packed_seed1", "packed", 1.5, 2.0, 12, [0.3, 0.5]))
    groups = group_runs([first, second])
    assert [(g.name, len(g.runs)) for g in groups] == [(str(tmp_path / "a" / "packed"), 1),
                                                      (str(tmp_path / "b" / "packed"), 1)]
    other = load_run(write_run(tmp_path / "a" / "packed_seed2", "packed", 1.7, 2.0, 12, [0.3, 0.5]))
    with pytest.raises(RunError, match="packed_seed1 and .*packed_seed2 look like seeds of one configuration, but "
                                       "their run.json differ in packing_factor"):
        group_runs([first, other])


def test_seeds_evaluated_at_other_counts_are_read_at_one_seed_s_counts(tmp_path):
    runs = [load_run(write_run(tmp_path / "packed_seed1", "packed", 1.5, 2.0, 10, [0.2, 0.4, 0.5])),
            load_run(write_run(tmp_path / "packed_seed2", "packed", 1.5, 2.0, 12, [0.3, 0.5]))]
    # Seed 2 (fewer evaluations: at 60 and 120 sequences) gives the counts; seed 1 (at 50, 100 and
    # 150) is read there: 0.2 + 0.2 * 10 / 50 = 0.24 at 60, 0.4 + 0.1 * 20 / 50 = 0.44 at 120.
    points = group_runs(runs)[0].points("eval")
    assert [p[0] for p in points] == [60, 120]
    assert points[0][2] == pytest.approx([0.24, 0.3]) and points[1][2] == pytest.approx([0.44, 0.5])
    assert points[1][1] == pytest.approx((24.0 + 20.0) / 2)  # seconds, read the same way


def test_the_alternated_throughput_is_quoted_with_its_range(tmp_path):
    assert describe_speedup([1.1, 1.3, 1.2], 1.25) == (
        "speed-up 1.20x (median of 3 alternated rounds, range 1.10-1.30) at packing factor 1.250: 0.96 of it")
    noisy = describe_speedup([0.9, 1.3, 1.2], 1.25)  # rounds 0.40 apart for an effect of 0.20
    assert noisy.endswith("the rounds disagree by 0.40, more than the 0.20 measured: the machine was too loaded to "
                          "tell")
    path = tmp_path / "throughput.json"
    # In real tokens/s, held to the ratio of the real tokens a row each mode timed (0.98 / 0.49 = 2.0),
    # not to the packing factor nor in sequences/s: the rounds read other sequences.
    path.write_text(json.dumps({"tiny": {"speedups": {"padded": [1.0, 1.0], "packed": [2.6, 2.8]},
                                         "token_speedups": {"padded": [1.0, 1.0], "packed": [1.8, 2.0]},
                                         "modes": {"padded": {"padding_efficiency": [0.5, 0.48]},
                                                   "packed": {"padding_efficiency": [0.98, 0.98]}},
                                         "packing_factor": 2.1}}))
    assert throughput_lines(str(path)) == [
        "throughput in real tokens/s, tiny config, alternated (scripts/benchmark_training.py): packed speed-up "
        "1.90x (median of 2 alternated rounds, range 1.80-2.00) at real-token ratio 2.000: 0.95 of it"]
    assert throughput_lines(str(path), "f1")[0].startswith(
        "throughput in real tokens/s, tiny task, alternated (scripts/benchmark_finetuning.py): packed speed-up 1.90x")
    path.write_text(json.dumps({"tiny": {"speedups": {"padded": [1.0], "packed": [1.2]}, "packing_factor": 1.25}}))
    assert throughput_lines(str(path)) == [  # a measurement of an earlier version
        "throughput in sequences/s (measured before real tokens/s were), tiny config, alternated in one process "
        "(scripts/benchmark_training.py): packed speed-up 1.20x (median of 1 alternated round, range 1.20-1.20) at "
        "packing factor 1.250: 0.96 of it"]
    # The modes in another order (json.dump(sort_keys=True) puts packed first): held to the padded side.
    measured = {"tiny": {
        "token_speedups": {"packed": [1.8, 2.0], "padded": [1.0, 1.0]},
        "modes": {"packed": {"padding_efficiency": [0.98, 0.98]}, "padded": {"padding_efficiency": [0.5, 0.48]}}}}
    path.write_text(json.dumps(measured))
    assert "at real-token ratio 2.000: 0.95 of it" in throughput_lines(str(path))[0]
    for broken, why in (({"packed": [1.8, 2.0]}, "no one mode its speed-ups are against"),  # nothing it is against
                        ({"packed": [1.8, 2.0], "padded": [1.0, 1.0], "padded_too": [1.0, 1.0]}, "no one mode"),
                        ({"packed": [1.8, float("nan")], "padded": [1.0, 1.0]}, "speed-up nan is not a figure"),
                        ({"packed": [-2.0], "padded": [1.0]}, "speed-up -2.0 is not a figure")):
        path.write_text(json.dumps({"tiny": {**measured["tiny"], "token_speedups": broken}}))
        with pytest.raises(RunError, match=f"not a scripts/benchmark_training.py --output_json measurement "
                                           f"\\(tiny: ValueError: {why}"):
            throughput_lines(str(path))
    for efficiency in (0.0, 7.0, None):  # edited by hand
        measured["tiny"]["modes"]["padded"]["padding_efficiency"] = [efficiency, 0.5]
        path.write_text(json.dumps(measured))
        with pytest.raises(RunError, match=rf"\(tiny: ValueError: padded's padding efficiency {efficiency} is not a "):
            throughput_lines(str(path))
    measured["tiny"]["modes"]["padded"]["padding_efficiency"] = [0.5, 0.48]
    # Against another mode than padding (benchmark_training.py --modes=bucketed,packed): said.
    path.write_text(json.dumps({"tiny": {**measured["tiny"], "baseline": "bucketed", "modes": {
        "bucketed": {"padding_efficiency": [0.7]}, "packed": {"padding_efficiency": [0.98]}}}}))
    assert ": packed against bucketed speed-up 1.90x" in throughput_lines(str(path))[0]
    path.write_text(json.dumps({"tiny": {**measured["tiny"], "baseline": "packed"}}))
    with pytest.raises(RunError, match="against packed itself: none of packing to quote"):
        throughput_lines(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(RunError, match="throughput.json: not a scripts/benchmark_training.py --output_json"):
        throughput_lines(str(path))


@pytest.mark.slow  # the command for real, in a subprocess, once
def test_cli_writes_a_png_and_a_table(tmp_path):
    padded = write_run(tmp_path / "padded", "padded", 1.0, 2.0, 8, [0.2, 0.4])
    packed = write_run(tmp_path / "packed", "packed", 2.0, 2.0, 16, [0.4, 0.5])
    output = tmp_path / "curves.png"
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "compare_curves.py"), padded, packed,
                             "--output", str(output), "--accuracy", "0.4"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and output.stat().st_size > 20_000
    rows = [line for line in result.stdout.splitlines() if line.startswith("| packed")]
    assert rows and "| 2.00 |" in rows[0]
    rising = write_run(tmp_path / "rising", "packed", 2.0, 2.0, 16, [0.3, 0.5])
    auto = run_command("compare_curves", padded, rising, "--output", str(output), "--accuracy", "auto")
    # 90% of the way from the highest first evaluation (0.3) to the lowest final one (0.4).
    assert auto.returncode == 0 and "sequences to 0.390" in auto.stdout
    # Through tf.io.gfile, as on a bucket: the runs read and the figure written by file:// URIs.
    remote = run_command("compare_curves", "file://" + padded, "file://" + packed, "--output",
                         f"file://{tmp_path}/remote curves.png", "--accuracy", "0.4")
    assert remote.returncode == 0, remote.stderr
    assert (tmp_path / "remote curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert remote.stdout.splitlines()[:-1] == result.stdout.splitlines()[:-1]  # all but the figure's path


def test_compare_curves_is_a_function_of_its_settings_as_a_notebook_calls_it(tmp_path):
    """compare_curves(CompareSettings(...)): the command's table and notes as lines, its rows in
    numbers, the PNG written; a setting that does not fit the runs is a SettingsError, one line."""
    from bert_packed.errors import SettingsError
    from bert_packed.reports.comparison import CompareSettings, compare_curves

    padded = write_run(tmp_path / "padded", "padded", 1.0, 2.0, 8, [0.2, 0.4])
    packed = write_run(tmp_path / "packed", "packed", 2.0, 2.0, 16, [0.4, 0.5])
    output = str(tmp_path / "curves.png")
    comparison = compare_curves(CompareSettings(runs=(padded, packed), output=output, accuracy="0.4"))
    assert comparison.accuracy == 0.4 and comparison.output == output
    assert [row["run"] for row in comparison.rows] == ["padded", "packed"] and comparison.rows[1]["packing_factor"] == 2.0
    assert comparison.lines[-1] == f"curves: {output}" and any(line.startswith("| packed") for line in
                                                                 "\n".join(comparison.lines).splitlines())
    assert open(output, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    command = run_command("compare_curves", padded, packed, f"--output={output}", "--accuracy=0.4")
    assert command.stdout.rstrip("\n").split("\n") == "\n".join(comparison.lines).split("\n")
    with pytest.raises(SettingsError, match="--labels has 1 names for 2 runs"):
        CompareSettings(runs=(padded, packed), labels=("a",))
    with pytest.raises(SettingsError, match="expected one or more run directories"):
        CompareSettings()


def test_an_output_under_a_missing_directory_or_a_file_is_one_line_naming_it(tmp_path):
    """The lock beside --output is written first: what the storage refuses names the directory the
    user gave (it was an internal error naming the lock's temporary file)."""
    run = write_run(tmp_path / "run", "padded", 1.0, 1.0, 8, [0.1, 0.2])
    (tmp_path / "a_file").write_text("x")
    for parent, reason in ((tmp_path / "missing", "No such file or directory"), (tmp_path / "a_file", "Not a directory")):
        result = run_command("compare_curves", run, f"--output={parent / 'curves.png'}")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1] == f"compare_curves: error: --output: {parent}: {reason}"
    assert sorted(os.listdir(tmp_path)) == ["a_file", "run"]  # no lock file left beside them


def test_bad_run_directories_are_named(tmp_path):
    with pytest.raises(RunError, match="no such run directory"):
        load_run(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(RunError, match="empty: no train_log.jsonl records"):
        load_run(str(tmp_path / "empty"))
    begun = write_run(tmp_path / "begun", "padded", 1.0, 2.0, 8, [0.2])
    (tmp_path / "begun" / "train_log.jsonl").write_text(json.dumps({"step": 0, "sequences": 0, "seconds": 0.0}) + "\n")
    with pytest.raises(RunError, match=r"begun: its train_log.jsonl ends at step 0 after 0.0 s of training: no update"):
        load_run(begun)
    unscored = write_run(tmp_path / "unscored", "padded", 1.0, 2.0, 8, [0.2])
    (tmp_path / "unscored" / "eval_log.jsonl").write_text(json.dumps({"step": 5, "sequences": 40, "seconds": 10.0,
                                                                      "questions_scored": 0}) + "\n")
    with pytest.raises(RunError, match=r"unscored: its evaluations scored nothing \(no MLM accuracy, no loss: a "
                                       r"predict file without answers\?\)"):
        load_run(unscored)
    result = run_command("compare_curves", str(tmp_path / "missing"))
    assert result.returncode == 2 and result.stderr.strip() == (
        f"compare_curves: error: {tmp_path / 'missing'}: no such run directory")


def test_runs_with_and_without_the_nsp_loss_are_compared_with_a_warning(tmp_path):
    with_head = write_run(tmp_path / "nsp", "padded", 1.0, 2.0, 8, [0.2, 0.4])
    without = write_run(tmp_path / "mlm_only", "padded", 1.0, 2.0, 8, [0.2, 0.4])
    info = json.loads((tmp_path / "mlm_only" / "run.json").read_text())
    (tmp_path / "mlm_only" / "run.json").write_text(json.dumps({**info, "nsp_loss": False}))
    result = run_command("compare_curves", with_head, without, "--output", str(tmp_path / "c.png"), "--accuracy", "0.4")
    assert result.returncode == 0, result.stderr
    assert "warning: mlm_only trained without the NSP loss (--nsp_loss=false), the others with it: their losses " \
           "differ by the NSP term; compare MLM accuracy (the MLPerf metric)" in result.stderr.splitlines()


def test_fine_tuning_runs_are_compared_by_their_figure_a_target_of_their_own_and_their_benchmark(tmp_path):
    """SQuAD runs (F1, 0-100) are held to a target of their own curves unless one is given (MLPerf's
    0.720 of MLM accuracy was met by every first evaluation), a packed update's sequences are
    measured from its log, and the notes name fine-tuning's benchmark and job."""
    runs = []
    for mode, factor, sequences, f1 in (("padded", 1.0, 32, [40.0, 70.0]), ("packed", 1.9, 30, [50.0, 76.0])):
        directory = write_run(tmp_path / f"first_year_{mode}", mode, factor, 2.0, sequences, [0.0, 0.0])
        for name in ("train_log.jsonl", "eval_log.jsonl"):
            records = [json.loads(line) for line in open(os.path.join(directory, name))]
            for record, value in zip(records, f1 if name == "eval_log.jsonl" else [None] * len(records)):
                record.pop("mlm_accuracy")
                if value is not None:
                    record["f1"] = value
            with open(os.path.join(directory, name), "w") as f:
                f.writelines(json.dumps(record) + "\n" for record in records)
        info = json.loads(open(os.path.join(directory, "run.json")).read())
        with open(os.path.join(directory, "run.json"), "w") as f:  # two micro-steps an update: 64 and 60 sequences
            json.dump({**info, "steps_per_update": 2, "doc_stride": 128}, f)
        runs.append(directory)
    result = run_command("compare_curves", *runs, "--output", str(tmp_path / "c.png"))
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("\n\n")[1].splitlines()
    # 90% of the way from the highest first evaluation (50) to the lowest final one (70).
    assert notes[0] == "target F1 68.000 (--accuracy=auto: every run reaches it, none at its first evaluation); 2 of " \
                       "the 2 configurations reached it in every seed"
    assert notes[1].endswith("measured alternately in one process (scripts/benchmark_finetuning.py, --throughput)")
    assert notes[-1].endswith("make finetune FINETUNE_FLAGS=--seeds=1,2,3 runs three seeds of each, for bands")
    rows = {line.split(" | ")[0]: line.split(" | ") for line in result.stdout.splitlines()
            if line.startswith("| first_year")}
    assert rows["| first_year_padded"][4] == "64.0" and rows["| first_year_packed"][4] == "60.0"
    assert rows["| first_year_padded"][5] == "70.0000" and rows["| first_year_packed"][5] == "76.0000"
    given = run_command("compare_curves", *runs, "--output", str(tmp_path / "c.png"), "--accuracy", "75")
    assert "target F1 75.000 (--accuracy); 1 of the 2 configurations reached it in every seed" in given.stdout
    # A target of another scale (MLM accuracy's 0.72 for F1 in percent) is met at once: said.
    fraction = run_command("compare_curves", *runs, "--output", str(tmp_path / "c.png"), "--accuracy", "0.72")
    assert ("target F1 0.720 (--accuracy); 2 of the 2 configurations reached it in every seed; every run met it at "
            "its first evaluation, so the to-target columns time that evaluation only (is it a target of the F1's "
            "scale?); --accuracy=auto picks one between the first evaluations and the final ones") in fraction.stdout
    # Evaluated once (at the end), or never: a table without a target, and why.
    for name, records in (("eval_log.jsonl", 1), ("eval_log.jsonl", 0)):
        for directory in runs:
            lines = open(os.path.join(directory, name)).read().splitlines()
            with open(os.path.join(directory, name), "w") as f:
                f.writelines(line + "\n" for line in lines[-records:] if records)
        result = run_command("compare_curves", *runs, "--output", str(tmp_path / "c.png"))
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n\n")[1].splitlines()[0] == (
            "no time-to-accuracy figure: each run was evaluated once, so there is no curve to time; evaluate during "
            "training (--eval_every_samples), or give --accuracy" if records else
            "no time-to-accuracy figure: first_year_padded, first_year_packed have no evaluations (eval_log.jsonl); "
            "give --accuracy, or evaluate during training")
    auto = run_command("compare_curves", *runs, "--output", str(tmp_path / "c.png"), "--accuracy=auto")
    assert auto.returncode == 2 and auto.stderr.strip().splitlines()[-1] == (
        "compare_curves: error: --accuracy auto: first_year_padded, first_year_packed have no evaluations "
        "(eval_log.jsonl), whose curves it picks a target from; give --accuracy=NUMBER")
