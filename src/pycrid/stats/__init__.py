"""Container and pod statistics: cgroup and /proc readers, the sampling loop, metrics.

Pure readers over directories (``cgroups`` with the file formats in ``cgfiles``,
``procfs`` for descriptor counts, ``devices`` for device names, ``netdev``), one
background ``Sampler`` that keeps the last two samples of every running object, and
``metrics`` that turns samples into cAdvisor-named series. The core maps CRI ids and
filters onto it (core/stats_queries.py); the edge turns the results into protobuf
(cri/stats_messages.py).
"""
