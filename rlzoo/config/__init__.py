"""Configuration: the run schema, config layers, presets, component parameters; the resolved config.
"""
