"""Fine-tuning on packed rows: tasks and their files, examples encoded and packed, and scores."""
