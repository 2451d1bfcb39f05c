"""The sparse-MLA model (DeepSeek-V3.2-style attention with a lightning indexer) and its batch runner."""
