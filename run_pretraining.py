"""Pre-train BERT: python run_pretraining.py --flagfile=configs/<name>.cfg (see bert_packed/cli)."""

from bert_packed.cli.run_pretraining import entry_point

if __name__ == "__main__":
    entry_point()
