"""rlzoo's shipped configs (installed as ``rlzoo_configs``): default.yaml and algo presets."""
