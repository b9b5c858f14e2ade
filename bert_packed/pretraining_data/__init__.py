"""Text -> MLPerf pre-training instances -> unpacked TFRecords.

  corpus.py          text in four formats (WikiExtractor, sentences, documents, JSON lines) -> documents of sentences
  tokenization.py    BERT WordPiece through HF tokenizers
  instances.py       NSP pairs and masked-LM predictions (the MLPerf reference's algorithm)
  create_dataset.py  the resumable job: files -> shards, histogram.json, metadata.json
"""
