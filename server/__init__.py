"""The co-packaged OpenAI-compatible server and its sparse-MLA engine."""
