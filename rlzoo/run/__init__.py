"""A run: its parts, its directory, checkpoints, resume, tracking, evaluation, the trainer that drives the steps
(and the asynchronous generator beside it), and the loops of ``rlzoo sft`` and ``rlzoo rm``.
"""
