"""What a command reads: datasets (metadata.json), what a file is, and the files it is given."""
