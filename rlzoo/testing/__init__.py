"""The plugin test kit: the invariants every component of a kind must keep, for rlzoo's own tests
and plugin authors' test suites.

Plugin authors import the kit from :mod:`rlzoo.api` (``from rlzoo.api import check_component``),
the one public surface; the modules here are rlzoo's internals, like every other module. The
kit's names were importable from ``rlzoo.testing`` in plugin API 2.0: that path still works
until API 3, with a :class:`DeprecationWarning` naming ``rlzoo.api`` (:mod:`rlzoo.compat`), so
the ``-W error::DeprecationWarning`` recipe of docs/plugins.md finds it.

- :mod:`rlzoo.testing.component_checks`: ``check_component`` and each kind's checks;
- :mod:`rlzoo.testing.tool_checks`: ``check_tool``;
- :mod:`rlzoo.testing.env_checks`: ``check_environment``.
"""

from rlzoo.compat import package_getattr

__getattr__ = package_getattr("rlzoo.testing")  # its API 2.0 names, deprecated
