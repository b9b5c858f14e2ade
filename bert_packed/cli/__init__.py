"""Command-line edges: flag parsing and main() functions; the library below takes plain arguments."""
