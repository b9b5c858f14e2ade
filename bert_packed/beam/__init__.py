"""Data preparation on Apache Beam (the `beam` extra): create_pretraining_data and
pack_pretraining_data with their jobs run by a pipeline, for a corpus larger than one machine.
The pipelines are in bert_packed.beam.pipelines; `python -m bert_packed.beam` runs them.

Nothing is imported here: `python -m bert_packed.beam` imports this package before the command
has set up its output, and apache_beam logs as it is imported.
"""
