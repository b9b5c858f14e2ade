"""What a user sees on the console: progress lines (one per state in a log, one rewritten line on a
terminal) and TensorFlow loading quietly."""

import io
import os

import pytest
from conftest import run_command

from bert_packed.console.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_each_count_once():
    log = io.StringIO()
    progress = Progress("pack: reading", total=3, unit="files", stream=log)
    for _ in range(3):
        progress.update(1)
    progress.close()
    lines = log.getvalue().splitlines()
    # The first update, then the last (the 10 s interval in between has not passed); close adds nothing.
    assert [line.split(" (")[0] for line in lines] == ["pack: reading: 1/3 files", "pack: reading: 3/3 files"]
    assert "left" not in lines[0]  # one count: no rate to tell the time left by yet


def test_the_time_left_is_timed_from_the_first_count_and_said_in_a_person_s_unit(monkeypatch):
    """Six shards written in parallel: the first ends after 30 s, the next 10 s later. Timed from
    the start, the second line would say 80 s left; from the first count, 40 s."""
    from bert_packed.console import progress as module

    now = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    log = io.StringIO()
    progress = Progress("pack: writing", total=6, unit="shards", stream=log)
    for now[0] in (30.0, 40.0):
        progress.update(1)
    assert log.getvalue().splitlines() == ["pack: writing: 1/6 shards (0.033/s)",
                                           "pack: writing: 2/6 shards (0.05/s, about 40 s left)"]
    assert [module.duration(s) for s in (45, 720, 12240)] == ["45 s", "12 min", "3.4 h"]


def test_close_writes_a_count_not_yet_written():
    log = io.StringIO()
    progress = Progress("create", total=None, unit="shards", stream=log)
    progress.update(1)
    progress.update(1)  # within 10 s of the first line: not written
    progress.close()
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == ["create: 1 shards", "create: 2 shards"]


def test_a_terminal_line_is_rewritten_and_ended():
    terminal = Terminal()
    progress = Progress("train", total=2, stream=terminal)
    progress.update(1)
    progress.update(1)
    progress.close()
    text = terminal.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "train: 2/2 items" in text


FAKE_TENSORFLOW = """
import os, time
time.sleep(0.2)  # loading takes a while: threads that load it together overlap
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
os.write(2, b"I0000 00:00:1795449405.870070 1 port.cc:153] oneDNN custom operations are on.\\n")
os.write(2, b"E0000 00:00:1795449405.870070 1 loader.cc:1] a real problem\\n")
print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
found = []
for name in ("jax", "pandas", "matplotlib"):  # as TFLite and Keras import them: where installed
    try:
        __import__(name)
        found.append(name)
    except ImportError:
        pass
OPTIONAL = found
"""


@pytest.mark.slow
def test_tensorflow_loads_quietly_but_its_errors_still_show(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    for name in ("jax", "pandas", "matplotlib"):
        (tmp_path / f"{name}.py").write_text("")
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    environment["PYTHONPATH"] = str(tmp_path)

    def load(verbosity):
        code = f"from bert_packed.console.tensorflow_loading import import_tensorflow; import_tensorflow({verbosity})"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                              timeout=60)

    quiet, verbose = load(0), load(1)
    assert quiet.returncode == verbose.returncode == 0
    assert quiet.stderr == "E0000 00:00:1795449405.870070 1 loader.cc:1] a real problem\n"
    assert quiet.stdout == "2\n" and verbose.stdout == "None\n"
    assert len(verbose.stderr.splitlines()) == 3
    # Threads that load it at once (the packer's readers did): no hang, the error shown once.
    threads = subprocess.run([sys.executable, "-c", "import threading\n"
                              "from bert_packed.console.tensorflow_loading import import_tensorflow\n"
                              "threads = [threading.Thread(target=import_tensorflow) for _ in range(4)]\n"
                              "[thread.start() for thread in threads]\n[thread.join() for thread in threads]"],
                             capture_output=True, text=True, env=environment, timeout=60)
    assert threads.returncode == 0 and threads.stderr == "E0000 00:00:1795449405.870070 1 loader.cc:1] a real problem\n"
    # A command's start-up leaves out what only TFLite's and Keras's unused features import; each
    # imports once TensorFlow is loaded. A library caller's TensorFlow (a notebook's) keeps them.
    code = ("from bert_packed.console.tensorflow_loading import import_tensorflow\n"
            "import sys\ntf = import_tensorflow(0, command={})\nprint(tf.OPTIONAL)\n"
            "import jax, pandas, matplotlib\nprint(sorted(name for name in ('jax', 'pandas', 'matplotlib') "
            "if sys.modules[name]))")
    for command, found in ((True, "[]"), (False, "['jax', 'pandas', 'matplotlib']")):
        loaded = subprocess.run([sys.executable, "-c", code.format(command)], capture_output=True, text=True,
                                env=environment, timeout=60)
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout.splitlines()[1:] == [found, "['jax', 'matplotlib', 'pandas']"]


def flags_and_settings(command):
    """{flag name: flag} of a command, the setting fields of its SETTINGS, and its module."""
    import importlib

    from bert_packed.settings import settings_of

    module = importlib.import_module(f"bert_packed.cli.{command}")
    made = {flag.name: flag for flag in module.FLAGS.get_flags_for_module(module.__name__)}
    return made, settings_of(*module.SETTINGS), module


@pytest.mark.parametrize("command", ["run_pretraining", "create_pretraining_data", "pack_pretraining_data",
                                     "pick_eval_samples", "export_model", "compare_curves", "plan_packing"])
def test_a_command_s_flags_are_its_settings_fields_each_declared_once(command):
    made, fields, module = flags_and_settings(command)
    aliases = {alias: field.name for field in fields for alias in field.metadata["aliases"]}
    assert sorted(made) == sorted([field.name for field in fields] + list(aliases))  # no flag of its own, none left out
    assert all(made[alias].help.endswith(f"--{name}.") for alias, name in aliases.items())
    made = {name: flag for name, flag in made.items() if name not in aliases}
    for field in fields:
        flag = made[field.name]
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        assert flag.default == default and field.metadata["help"].rstrip(".").removesuffix(")") in flag.help, field.name
    assert sorted(name for names in module.HELP_GROUPS.values() for name in names) == sorted(made)  # each in --help once


def test_help_and_helpfull_are_no_errors():
    short, full = run_command("plan_packing", "--help"), run_command("plan_packing", "--helpfull")
    assert short.returncode == full.returncode == 0 and short.stderr == full.stderr == ""
    assert "plan: --algorithm, --max_sequences_per_pack" in short.stdout and "--verbosity" not in short.stdout
    assert full.stdout.startswith(short.stdout) and "--verbosity" in full.stdout


@pytest.mark.slow  # the command as `python -m`: its module is __main__ there
def test_a_command_run_as_a_module_lists_its_flags():
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", "bert_packed.cli.pick_eval_samples", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--num_examples_to_pick: Records to pick" in result.stdout, result.stdout[-2000:]


@pytest.mark.slow  # the scripts as processes: their start-up is the subject
@pytest.mark.parametrize("script", ["main_job", "finetune_job", "device_check"])
def test_the_jobs_the_tests_run_in_their_process_start_quietly_in_their_own(script):
    """`make run`, `make finetune` and the device check run in the tests' process (README and
    doctor tests); here each starts as a user's `python scripts/X.py --help` does, with nothing
    of the tests' environment: its flags, and not a TensorFlow C++ line (the device check imports
    TensorFlow as it loads)."""
    import subprocess
    import sys

    from conftest import REPO
    from test_readme import assert_reads_well, environment

    result = subprocess.run([sys.executable, os.path.join("scripts", f"{script}.py"), "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env=environment())
    assert result.returncode == 0 and "\n  --" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]  # its flags
    assert_reads_well(result.stdout + result.stderr, f"scripts/{script}.py --help", 80)


def test_run_pretraining_s_flags_say_the_reference_s_defaults_and_their_kinds():
    from absl import flags

    made, _, module = flags_and_settings("run_pretraining")
    assert made["train_batch_size"].help == ("Rows per micro-batch, all replicas: packs when packed, unpacked rows "
                                             "with --adjust_batch_for_packing (reference default 32).")
    assert made["max_seq_length"].help.endswith("else 512; reference default 128).")
    assert isinstance(made["xla"], flags.BooleanFlag) and made["precision"].parser.enum_values == ["fp32", "bf16", "fp16"]
    assert (made["max_eval_steps"].default, made["bucket_boundaries"].default) == (None, [])
    assert module.FIRST_RUN == ("bert_config_file", "input_files", "eval_files", "max_seq_length",
                                "max_predictions_per_seq", "init_checkpoint", "train_batch_size", "learning_rate",
                                "num_train_steps", "output_dir")


def test_the_fast_tier_starts_no_process():
    import subprocess
    import sys

    from conftest import ProcessStarted

    with pytest.raises(ProcessStarted, match="test_the_fast_tier_starts_no_process starts a process"):
        subprocess.run([sys.executable, "-c", "pass"])
