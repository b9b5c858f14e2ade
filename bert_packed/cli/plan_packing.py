"""Plan a packing from a length histogram and report it.

    python -m bert_packed.packing --histogram H.json --algorithm lp --max_sequences_per_pack 3
    bert-packed-plan --histogram H.json --algorithm all --json

--max-sequences-per-pack and --max-sequence-length are aliases of the underscored flags. Exit
status 2 with a one-line message on bad input.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.packing.pack_settings import PlanSettings
from bert_packed.packing.plan_command import plan_packing
from bert_packed.settings import help_groups

FLAGS = flags.FlagValues()
SETTINGS = (PlanSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)
flags.mark_flag_as_required("histogram", flag_values=FLAGS)

PROGRAM = "plan_packing"


def main(argv) -> None:
    del argv
    settings = from_flags(FLAGS, PlanSettings)
    report = plan_packing(settings)
    if settings.json:
        json.dump(report.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(report.text())


def entry_point():
    run(main, PROGRAM, "histogram", "Nothing was written", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
