"""The engine: scheduler, paged KV cache with prefix caching, sequences, sampling, and the core step loop."""
