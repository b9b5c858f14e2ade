"""Check the install: TensorFlow's build, the GPUs it sees, XLA, bf16, and packed training.

    bert-packed-doctor            (or: python -m bert_packed.doctor)

One line a check; a problem's line says how to fix it. On a machine without a GPU it says so
and checks the CPU. The last check runs a few packed updates of a tiny model on the first GPU
(else the CPU) and holds them to the same updates on the same sequences one a row. Exit status 0
when every check passed, 1 when one found a problem.
"""

from __future__ import annotations

from absl import flags

from bert_packed.cli.common import run
from bert_packed.console.tensorflow_loading import import_tensorflow

FLAGS = flags.FlagValues()
PROGRAM = "bert-packed-doctor"


def report(findings) -> tuple[list[str], int]:
    """(the report's lines, the number of problems) of the doctor's Findings."""
    width = max(len(f.check) for f in findings)
    lines = []
    for finding in findings:
        lines.append(f"{'ok' if finding.fix is None else 'PROBLEM':<8}{finding.check:<{width + 2}}{finding.found}")
        if finding.fix is not None:
            lines.append(f"{'':<8}{'':<{width + 2}}fix: {finding.fix}")
    problems = sum(f.fix is not None for f in findings)
    return lines, problems


def main(argv, steps=None) -> int:
    del argv
    import_tensorflow(FLAGS.verbosity, command=True)
    from bert_packed.training.doctor import checks

    lines, problems = report(checks(steps))
    print("\n".join(lines))
    print(f"{PROGRAM}: {'no problem found' if not problems else f'{problems} problem(s): see fix above'}")
    return 1 if problems else 0


def entry_point(steps=None):
    """The command; `steps`: a StepPool its caller keeps (bert_packed.training.step_pool)."""
    run(lambda argv: main(argv, steps), PROGRAM, (), "Nothing was written", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
