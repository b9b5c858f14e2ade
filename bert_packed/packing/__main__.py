"""python -m bert_packed.packing: see bert_packed.cli.plan_packing."""

from bert_packed.cli.plan_packing import main

if __name__ == "__main__":
    main()
