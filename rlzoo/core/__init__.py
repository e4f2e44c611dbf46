"""Foundations: errors, masked reductions, tensors that carry a batch, token helpers, processes and signals.

Imports nothing of rlzoo outside this folder.
"""
