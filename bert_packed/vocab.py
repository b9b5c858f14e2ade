"""`python -m bert_packed.vocab`: the vocabulary builder (bert_packed/cli/build_vocabulary.py).

A launcher, like `python -m bert_packed.packing`: it runs the command by name (and nothing when
imported).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_packed.cli.build_vocabulary", run_name="__main__", alter_sys=True)
