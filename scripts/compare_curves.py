"""Accuracy/loss curves and a summary table for runs; see bert_packed/cli/compare_curves.py."""

from bert_packed.cli.compare_curves import entry_point

if __name__ == "__main__":
    entry_point()
