"""How fast run_pretraining stops when SIGTERM comes as an evaluation of MLPerf's size is due.

    python scripts/benchmark_signal_at_evaluation.py

Writes the shipped sample's records at L=512 twice (create_pretraining_data): once as training
data, once with five dupe passes as an eval set of about 10,000 sequences (MLPerf's is 10,000).
Then runs run_pretraining on the tiny config, as a process, with an evaluation due after its
first loop, twice: once left alone (how long the evaluation takes), once sent SIGTERM as that
evaluation starts (how long until the process has saved and exited). A preemptible VM gives
30 s; the target is 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import flags

from bert_packed.cli.common import run

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TARGET_SECONDS = 10.0
PROGRAM = "benchmark_signal_at_evaluation"

FLAGS = flags.FlagValues()
flags.DEFINE_integer("eval_dupe_factor", 5, "Dupe passes of the sample in the eval set (5: about 10,000 sequences).",
                     flag_values=FLAGS)


def command(*args: str) -> list[str]:
    return [sys.executable, *args]


def other_text(work: str) -> str:
    """The sample's paragraphs in the reverse order, as one sentence a line with a blank line every
    20 lines: other text (a run refuses to evaluate on records of its training text)."""
    sample = os.path.join(ROOT, "data", "wikipedia_sample")
    lines = []
    for name in sorted(os.listdir(sample)):
        with open(os.path.join(sample, name), encoding="utf-8") as f:
            lines += [line for line in f.read().splitlines() if line.strip() and not line.startswith(("<doc", "</doc"))]
    path = os.path.join(work, "other_text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + ("\n\n" if i % 20 == 19 else "\n") for i, line in enumerate(reversed(lines))))
    return path


def create(input_file: str, output_dir: str, dupe_factor: int) -> None:
    subprocess.run(command(os.path.join(ROOT, "scripts", "create_pretraining_data.py"), f"--input_file={input_file}",
                           f"--output_dir={output_dir}", "--max_seq_length=512", "--max_predictions_per_seq=76",
                           f"--dupe_factor={dupe_factor}", "--eval_fraction=0"), check=True, capture_output=True,
                   text=True)


def train(work: str, name: str, stop_at: str, *more: str) -> tuple[float, int, str]:
    """Runs the tiny config with an evaluation due after its first loop, and sends it SIGTERM at
    the first line of its log that holds `stop_at`; returns (seconds from the start of that
    evaluation to the process's end, the exit status, the last line)."""
    process = subprocess.Popen(
        command(os.path.join(ROOT, "run_pretraining.py"), f"--bert_config_file={ROOT}/configs/bert_config_tiny.json",
                f"--input_files={work}/train/part-*.tfrecord", f"--eval_files={work}/eval/part-*.tfrecord",
                f"--output_dir={work}/{name}", "--max_seq_length=512", "--max_predictions_per_seq=76",
                "--train_batch_size=4", "--eval_batch_size=64", "--num_train_steps=4", "--iterations_per_loop=2",
                "--eval_every_samples=8", "--verbosity=1", "--submission_division=open", *more),
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    started, lines = None, []
    for line in process.stderr:
        lines.append(line)
        if started is None and "evaluating at step" in line:
            started = time.perf_counter()
        if stop_at in line:
            process.terminate()
            break
    lines += process.communicate()[1].splitlines()
    if started is None:
        raise RuntimeError(f"no evaluation started:\n{''.join(lines[-20:])}")
    return time.perf_counter() - started, process.returncode, lines[-1].strip()


def main(argv) -> int:
    del argv
    with tempfile.TemporaryDirectory() as work:
        create(f"{ROOT}/data/wikipedia_sample/wiki_*", f"{work}/train", 1)
        create(other_text(work), f"{work}/eval", FLAGS.eval_dupe_factor)
        with open(f"{work}/eval/metadata.json", encoding="utf-8") as f:
            print(f"eval set: {json.load(f)['num_sequences']:,} sequences at L=512", flush=True)
        whole, _, _ = train(work, "left_alone", "eval at step 2")
        print(f"the evaluation at step 2, left alone: {whole:.1f} s", flush=True)
        stopped, status, last = train(work, "signalled", "evaluating at step 2")
        print(f"SIGTERM as it starts: the process exited {stopped:.1f} s later, status {status}: {last}", flush=True)
        again, again_status, again_last = train(work, "signalled", "evaluating at step 2")
        resumed = "resumed from" in again_last or again_status == 75
        print(f"the same command again starts with that evaluation (stopped again as it starts: status "
              f"{again_status}, {again:.1f} s)", flush=True)
    passed = stopped <= TARGET_SECONDS and status == 75 and again_status == 75 and resumed
    print(f"{PROGRAM}: {'PASS' if passed else 'FAIL'} (at most {TARGET_SECONDS:.0f} s)")
    return 0 if passed else 1


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing is kept", flag_values=FLAGS)
