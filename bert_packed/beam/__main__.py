"""`python -m bert_packed.beam create|pack ...`: the Beam commands (bert_packed/cli/beam.py).

A launcher, like `python -m bert_packed.packing`: it runs the command by name, and nothing in
the pipelines imports the command line.
"""

import runpy

runpy.run_module("bert_packed.cli.beam", run_name="__main__", alter_sys=True)
