"""Statistics over runs: intervals, differences, the seeds they need, and the comparison report
(below the commands: ``rlzoo compare`` and ``rlzoo sweep --until-resolved`` read, call these, print)."""
