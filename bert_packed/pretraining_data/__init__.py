"""Text -> MLPerf pre-training instances -> unpacked TFRecords.

  corpus.py          WikiExtractor or one-sentence-a-line text -> documents of sentences
  tokenization.py    BERT WordPiece through HF tokenizers
  instances.py       NSP pairs and masked-LM predictions (the MLPerf reference's algorithm)
  create_dataset.py  the resumable job: files -> shards, histogram.json, metadata.json
"""
