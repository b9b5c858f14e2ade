"""Fine-tune BERT on SQuAD v1.1, packed: python run_squad.py --train_file=... --do_train ... (see bert_packed/cli)."""

from bert_packed.cli.run_squad import entry_point

if __name__ == "__main__":
    entry_point()
