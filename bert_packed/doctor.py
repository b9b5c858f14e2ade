"""`python -m bert_packed.doctor`: the install's check (bert_packed/cli/doctor.py).

A launcher, like `python -m bert_packed.packing`: it runs the command by name, and only when run
(importing this module runs nothing).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_packed.cli.doctor", run_name="__main__", alter_sys=True)
