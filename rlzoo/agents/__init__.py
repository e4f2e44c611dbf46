"""Multi-turn episodes: environments, tool calls, the sandbox tools run in, playing turns.
"""
