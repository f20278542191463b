"""One-shot calls a command makes on a host: ``probe`` (doctor and preflight:
``host_imports``, ``network``), ``host_stacks`` (with ``pyspy`` and ``frames``),
``host_fetch``, ``node_top`` and the ``node_sampler`` it reads, ``envsync`` and
``wheelpass`` (``sshddp sync``), ``execute`` (``sshddp exec``).
"""
