"""What both sides of every wire share: stdlib-only Python 3.8, imported by the
coordinator's layers and shipped to the hosts with the host code.

``contract`` (the files a node's run directory holds, their records and ``SCHEMA``),
``compose`` (the one composer of a node's command line, which ``--dry-run`` calls too) and
one module per wire, each with its tagged messages and their encode/decode:
``session_messages`` (the coordinator and a host's launch session), ``standby_messages``
(a launch session and its standby), ``peer_messages`` (the supervisors among themselves).
"""
