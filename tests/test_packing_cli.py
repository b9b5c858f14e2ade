import json
import subprocess
import sys

import pytest
from conftest import run_command


def run_cli(*args):
    """The planner in this process (conftest.run_command), as `python -m bert_packed.packing` runs it."""
    return run_command("plan_packing", *args)


def run_cli_in_a_subprocess(*args):
    return subprocess.run([sys.executable, "-m", "bert_packed.packing", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def histogram_file(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"max_sequence_length": 8, "histogram": [4, 0, 2, 0, 2, 0, 0, 0]}))
    return str(path)


@pytest.mark.slow  # the command for real, through `python -m bert_packed.packing`, once
def test_json_report(histogram_file):
    result = run_cli_in_a_subprocess("--histogram", histogram_file, "--algorithm", "lp", "--max-sequences-per-pack", "3",
                                     "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("num_packs", "num_sequences", "efficiency", "packing_factor", "lower_bound_packs", "seconds",
                "strategies"):
        assert key in report
    assert report["num_packs"] == 3 and report["num_sequences"] == 8
    assert report["efficiency"] == pytest.approx(20 / 24)
    assert sum(count * len(lengths) for lengths, count in report["strategies"]) == 8


def test_all_algorithms_table(histogram_file):
    result = run_cli("--histogram", histogram_file, "--algorithm", "all")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[3:]}
    assert set(rows) == {"spfhp", "lpfhp", "nnlshp", "lp"}
    assert rows["lp"][2] == "3" and rows["spfhp"][2] == "4"  # packs column


def test_all_algorithms_json_at_unlimited_depth_keeps_the_greedy_ones(histogram_file):
    result = run_cli("--histogram", histogram_file, "--algorithm", "all", "--max-sequences-per-pack", "unlimited",
                     "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"spfhp", "lpfhp"}
    assert report["lpfhp"]["max_sequences_per_pack"] is None


@pytest.mark.parametrize("content, args, message", [
    ("[1, -1]", [], "count for length 2 is -1"),
    ("[1, 0.5]", [], "count for length 2 is 0.5"),
    ("[0, 0]", [], "empty"),
    ("{not json", [], "not valid JSON"),
    ('{"max_sequence_length": 1, "histogram": [1, 1]}', [], "longer than the maximum sequence length 1"),
    ("[1, 1]", ["--max-sequences-per-pack", "0"], "--max_sequences_per_pack=0: must be >= 1"),
    ("[1, 1]", ["--max-sequences-per-pack", "two"], "--max_sequences_per_pack=two: expected an integer"),
    ("[1, 1]", ["--algorithm", "magic"], "--algorithm=magic: value should be one of"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, args, message):
    path = tmp_path / "h.json"
    path.write_text(content)
    result = run_cli("--histogram", str(path), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_missing_file_is_named(tmp_path):
    result = run_cli("--histogram", str(tmp_path / "missing.json"))
    assert result.returncode == 2 and "missing.json: cannot read" in result.stderr


def test_the_planner_is_a_function_of_its_settings(histogram_file, tmp_path):
    """plan_packing(PlanSettings(...)) returns the plans the command prints, the comparison with a
    reference histogram of the same L included; the command's output is the report's text."""
    from bert_packed.errors import SettingsError
    from bert_packed.packing import HistogramError
    from bert_packed.packing.pack_settings import PlanSettings
    from bert_packed.packing.plan_command import plan_packing

    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps([0, 0, 0, 0, 0, 0, 0, 8]))  # every sequence L long: no padding
    report = plan_packing(PlanSettings(histogram=histogram_file, algorithm="all", reference_histogram=str(reference)))
    assert [p.algorithm for p in report.plans] == ["spfhp", "lpfhp", "nnlshp", "lp"]
    assert {p.algorithm: p.num_packs for p in report.plans} == {"spfhp": 4, "lpfhp": 4, "nnlshp": 4, "lp": 3}
    assert report.stats.num_sequences == 8 and report.stats.num_tokens == 20
    assert report.comparison["padding_fraction"] == [pytest.approx(1 - 20 / 64), 0.0]
    assert report.comparison["full_length_fraction"] == [0.0, 1.0]
    assert set(report.to_dict()) == {"spfhp", "lpfhp", "nnlshp", "lp", "reference"}
    printed = run_cli("--histogram", histogram_file, "--algorithm", "all", f"--reference_histogram={reference}")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines()[:3] == report.text().splitlines()[:3]
    assert printed.stdout.splitlines()[-2:] == report.text().splitlines()[-2:]
    with pytest.raises(SettingsError, match="--histogram: not given"):
        plan_packing(PlanSettings())
    with pytest.raises(SettingsError, match="--algorithm=magic: expected one of spfhp, lpfhp, nnlshp, lp, all"):
        PlanSettings(histogram=histogram_file, algorithm="magic")
    assert PlanSettings(histogram=histogram_file, max_sequences_per_pack=2).depth == 2  # a number, as the flag's text
    reference.write_text(json.dumps([1, 1]))
    with pytest.raises(HistogramError, match="its L is 2"):
        plan_packing(PlanSettings(histogram=histogram_file, reference_histogram=str(reference)))
