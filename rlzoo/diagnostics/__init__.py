"""What ``rlzoo doctor`` knows: detectors that read a run's logged curves for pathologies
(:mod:`rlzoo.diagnostics.detectors`), the one table of their thresholds with the source of
each (:mod:`rlzoo.diagnostics.thresholds`), the roofline of a step at this machine's measured
rates (:mod:`rlzoo.diagnostics.roofline`) and the pre-flight estimate of a run's peak memory
and step time from its plan (:mod:`rlzoo.diagnostics.preflight`).

The command (``rlzoo doctor``) is :mod:`rlzoo.commands.doctor`; the trainer runs the same detectors
every ``eval.every`` steps (``logging.doctor``) and ``rlzoo compare`` counts their findings.
"""
