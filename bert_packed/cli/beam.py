r"""Data preparation on Apache Beam: create_pretraining_data and pack_pretraining_data as
pipelines, with the same flags, checks and output, for a corpus larger than one machine.

    python -m bert_packed.beam create --input_file='gs://B/text/*' --output_dir=gs://B/unpacked \
        --max_seq_length=512 --max_predictions_per_seq=76 --dupe_factor=10 \
        --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp \
        --extra_package=dist/bert_packed-0.1.0-py3-none-any.whl
    python -m bert_packed.beam pack --input_files='gs://B/unpacked/part-*.tfrecord' \
        --output_dir=gs://B/packed --runner=DataflowRunner ...

Flags after the command's own are Beam's pipeline options (--runner, --project, --region,
--temp_location, --flink_master, --spark_master_url, ...). With no --runner the pipeline runs
here, on Beam's FnApiRunner: --direct_num_workers=N (0: one per core) and
--direct_running_mode=multi_processing for N processes (in_memory: one thread; multi_threading).
--num_workers goes on to the runner (Dataflow's first workers); with no --runner it is refused.
Worker processes' warnings are shown as the command's own; the rest of what they print goes to a
log file, named at the end when the pipeline failed (--verbosity=1: all of it shown instead).
docs/data.md, "Beyond one machine", has the cluster commands.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import re
import sys
import tempfile

from absl import logging as absl_logging

from bert_packed.cli.common import exit_with, exit_with_help, run
from bert_packed.errors import SettingsError, UserError
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.input_files import expand_globs
from bert_packed.packing.pack_dataset import verify_written
from bert_packed.storage import files

# Each command's flags are its single-machine command's (that module's FLAGS).
COMMANDS = {"create": "bert_packed.cli.create_pretraining_data", "pack": "bert_packed.cli.pack_pretraining_data"}


def main(argv):
    name = PROGRAM.split()[-1]
    command = importlib.import_module(COMMANDS[name])
    FLAGS = command.FLAGS  # noqa: N806 - the command's flags, by the name they have in its module
    beam = _quiet_beam(FLAGS.verbosity)
    # --num_workers is also Dataflow's pipeline option (its first workers), which absl parsed as
    # the single-machine command's: it goes on to the runner, which alone decides the workers.
    workers = [f"--num_workers={FLAGS.num_workers}"] if FLAGS["num_workers"].present else []
    options = beam.pipeline_options(argv[1:] + workers)
    if workers and not options.view_as(beam.StandardOptions).runner:
        raise SettingsError(f"--num_workers={FLAGS.num_workers} is a cluster runner's option (Dataflow's first "
                            f"workers); here, give --direct_num_workers (and --direct_running_mode=multi_processing "
                            f"for processes)")
    if name == "create":
        if FLAGS.output_file:
            raise SettingsError("--output_file: a pipeline writes a dataset directory; give --output_dir")
        settings = command.settings_from_flags()
        input_files = expand_globs(FLAGS.input_file, "--input_file")
        with _workers_output_logged(beam, FLAGS.verbosity):
            metadata = beam.create_on_beam(input_files, FLAGS.output_dir, settings, options)
    else:
        flagged = command.settings_from_flags()
        inputs = Dataset.described(expand_globs(FLAGS.input_files, "--input_files"), "--input_files")
        settings = flagged.pack_settings(inputs)
        with _workers_output_logged(beam, FLAGS.verbosity):
            metadata = beam.pack_on_beam(inputs, FLAGS.output_dir, settings, options)
        if FLAGS.verify:
            verify_written(FLAGS.output_dir, FLAGS.num_workers)
    command.report(PROGRAM, metadata, FLAGS.output_dir)


class _OwnLines(logging.Filter):
    """Leaves out Beam's own log lines (its runner's workers starting and stopping, an optional
    client library missing): the command's output is its own (--verbosity=1 shows them). A
    worker process's warning that is not Beam's own, which the runner logs as a line of its own
    ("Worker: severity: WARN ... message: ..."), is shown as the command's: a long sentence, say."""

    def __init__(self, package: str):
        super().__init__()
        self.package = package

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.pathname.startswith(self.package):
            return True
        if record.msg != "Worker: %s" or record.levelno < logging.WARNING:
            return False
        from apache_beam.portability.api import beam_fn_api_pb2
        from google.protobuf import text_format

        try:
            entry = text_format.Parse(str(record.args[0]), beam_fn_api_pb2.LogEntry())
        except text_format.ParseError:  # not a log entry as this Beam writes them: its own line
            return False
        if entry.log_location.startswith(self.package):
            return False
        # Its template ("%s: a sentence of %s tokens ...": the place, `file:line`, and the numbers
        # left open), so that repeats are counted as the command's own are. The place is up to the
        # last ":<line>: ", since a file's name may hold ": " and digits.
        found = re.match(r"(.*:\d+): (.*)", entry.message, re.S)
        place, rest = (found[1], found[2]) if found else ("", entry.message)
        number = re.compile(r"\d[\d,.]*")
        values = number.findall(rest)
        record.msg = ("%s: " if place else "") + number.sub("%s", rest.replace("%", "%%"))
        record.args = ((place,) if place else ()) + tuple(values)
        return True


def _quiet_beam(verbosity: int):
    """Imports the pipelines (apache_beam, which logs as it is imported) with Beam's lines left out."""
    spec = importlib.util.find_spec("apache_beam")
    if spec is None:  # make run installs the main job's needs only
        raise UserError("Apache Beam is not installed: pip install -e '.[beam]' in a clone (make test installs it "
                        "too), or pip install 'bert-packed[beam]'")
    handler = absl_logging.get_absl_handler()
    if verbosity < 1 and not any(isinstance(f, _OwnLines) for f in handler.filters):
        # First, before the filter that counts repeated warnings: Beam's are not counted.
        handler.filters.insert(0, _OwnLines(os.path.dirname(spec.origin)))
    from bert_packed.beam import pipelines as beam

    return beam


@contextlib.contextmanager
def _workers_output_logged(beam, verbosity: int):
    """Sends what the runner's worker processes print (Beam's lines at INFO, a crash's traceback) to
    a log file, named at the end when the pipeline failed (not for bad input, which its error
    names): they write to this process's stderr, file descriptor 2, which it lends them for the
    pipeline's run. Their warnings reach the command's output through the runner (_OwnLines)."""
    if verbosity >= 1:
        yield
        return
    descriptor, log_path = tempfile.mkstemp(prefix="bert-packed-beam-", suffix=".log")
    saved = os.dup(2)
    stderr, handler = sys.stderr, absl_logging.get_absl_handler().python_handler
    own = os.fdopen(os.dup(saved), "w", buffering=1)
    stream = handler.stream
    if _on_descriptor_2(stderr):  # this process's own lines still reach the terminal
        sys.stderr = own
    if _on_descriptor_2(stream):
        handler.stream = own
    os.dup2(descriptor, 2)
    keep = False
    try:
        yield
    except Exception as error:  # not an interrupt (BaseException): the command was stopped, not failed
        keep = not isinstance(error, UserError) or isinstance(error, beam.RunnerError)
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(descriptor)
        sys.stderr, handler.stream = stderr, stream
        own.close()
        if keep and files.size(log_path):
            logging.error("the pipeline's workers' own output: %s", log_path)
        else:
            files.remove(log_path)


def _on_descriptor_2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return False


PROGRAM = "bert_packed.beam"


def entry_point():
    global PROGRAM
    PROGRAM = "bert_packed.beam"
    if sys.argv[1:2] in (["-h"], ["--help"], ["--helpshort"]):
        exit_with_help(__doc__.strip())
    name = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""
    if name not in COMMANDS:
        exit_with(2, f"{PROGRAM}: error: {'unknown command ' + repr(name) if name else 'no command'}: give create or "
                     f"pack first, as in `python -m bert_packed.beam pack --input_files=... --output_dir=...` "
                     f"(--help after it lists its flags)")
    del sys.argv[1]
    command = importlib.import_module(COMMANDS[name])
    PROGRAM = f"bert_packed.beam {name}"
    try:
        run(main, PROGRAM, "output_dir", "Finished shards are kept", pass_on=True, flag_values=command.FLAGS)
    except SystemExit as done:
        pipelines = sys.modules.get("bert_packed.beam.pipelines")
        if pipelines is not None and pipelines.pipeline_left_running():
            # Its last line said: Python would wait at exit for Beam's threads, which wait for the
            # interrupted or failed pipeline's workers (forever, for one that was killed).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(done.code if isinstance(done.code, int) else int(done.code is not None))
        raise


if __name__ == "__main__":
    entry_point()
