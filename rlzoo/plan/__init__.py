"""The run plan: what a run is, decided once from the resolved config, before any model is built.
"""
