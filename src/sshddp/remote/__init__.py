"""Code that runs on the hosts: stdlib-only Python 3.8+, shipped over the connection.

Nothing here is installed on a host. For every remote call the coordinator sends the
sources of the modules the call needs (``sshddp.hosts.shipped``) in one JSON header on the
command's stdin; a tiny bootstrap (``python -c``) hands them to ``importer.py``, which serves
them from memory to ``import`` like any installed package, then runs the entry module's
``main(args)``. So each file imports what it uses, ruff and mypy (target 3.8) check it, and
the tests import it like any module.

Entry modules: ``session`` (a launch: probe, stage, start, follow), ``follow`` (a node's log
and status), ``stop``, ``stacks`` (every process's stacks), and ``supervisor`` (forked by
``boot``, or ``python -S supervisor.py RUNDIR``). ``rank`` is the shim every rank starts
through, ``ranksite`` the sitecustomize of every Python process of a node; both stand alone.
``contract`` names the files a node's run directory holds, with their records and schema
version.
"""
