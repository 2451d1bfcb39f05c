"""`python -m server.parallel`: the tensor-parallel ranks of a node other than node 0 (launcher.py).

The group itself, its collectives and rank 0's worker processes are server/distributed/.
"""
