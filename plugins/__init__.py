"""rlzoo's standard plugins (installed as ``rlzoo_plugins``), one module per family.

Each module is registered through the ``rlzoo`` entry-point group, exactly like a
third-party plugin package.
"""
