"""The package reads servers' metrics and GPUs' readings."""
