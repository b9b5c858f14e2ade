import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from bert_packed.curves import RunError, load_run, summary_table


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
    assert rows[1]["final_mlm_accuracy"] == 0.5


@pytest.mark.slow
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
    auto = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "compare_curves.py"), padded, packed,
                           "--output", str(output), "--accuracy", "auto"], capture_output=True, text=True, timeout=120)
    assert auto.returncode == 0 and "sequences to 0.360" in auto.stdout  # 0.9 x the lowest final 0.4


@pytest.mark.slow
def test_bad_run_directories_are_named(tmp_path):
    with pytest.raises(RunError, match="no such run directory"):
        load_run(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(RunError, match="empty: no train_log.jsonl records"):
        load_run(str(tmp_path / "empty"))
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "compare_curves.py"),
                             str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"compare_curves: error: {tmp_path / 'missing'}: no such run directory")
