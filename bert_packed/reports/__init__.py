"""Reports: what runs and measurements say when compared (curves.py: runs, configurations and their
table; speedups.py: speed-ups measured alternately; comparison.py: compare_curves, the curves drawn
and the notes)."""
