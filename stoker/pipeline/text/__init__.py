"""Text for BERT pretraining: vocabulary, corpus, tokenized shards, examples and packing."""
