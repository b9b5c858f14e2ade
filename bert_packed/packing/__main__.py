"""`python -m bert_packed.packing`: the planner command (bert_packed/cli/plan_packing.py).

A launcher, like the scripts/ entry points: it runs the command by name, and nothing in the
packing library imports the command line.
"""

import runpy

runpy.run_module("bert_packed.cli.plan_packing", run_name="__main__", alter_sys=True)
