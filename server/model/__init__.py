"""The sparse-MLA model (DeepSeek-V3.2-style attention with a lightning indexer) as torch modules.

It knows shapes and weights, not requests: server/engine/model_runner.py turns a scheduled batch
into its inputs. Its only server dependencies are the config and the tensor-parallel collectives.
"""
