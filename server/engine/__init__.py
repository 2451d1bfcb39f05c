"""The engine: scheduler, paged KV cache with prefix caching, sequences, sampling, the model runner
(batch inputs, CUDA-graph decode) and the core step loop."""
