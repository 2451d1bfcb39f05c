"""agentload's load generator: replays agentic coding sessions against OpenAI-compatible servers
(or our engine in-process) and records every latency in HDR histograms. Never imports torch."""

__version__ = "0.1.0"
