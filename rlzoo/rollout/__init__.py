"""Rollout: prompts to scored completions (the sampler), staleness, the asynchronous generator.
"""
