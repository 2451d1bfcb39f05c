"""Transports: how one planned request reaches a server and how its timed chunks come back."""
