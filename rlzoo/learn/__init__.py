"""The update: passes, KL, advantages, losses, corrections, optimizers.
"""
