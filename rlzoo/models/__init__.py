"""Models: building and loading them, their heads, log-probs, the KV-cache decode loop, the load-time
check, LoRA and reward models.
"""
