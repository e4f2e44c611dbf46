"""The plugin contract: component kinds, hook specifications, the registry, the checks on every
component, and loading plugins from entry points.
"""
