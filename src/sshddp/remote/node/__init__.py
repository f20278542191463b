"""The node's life on a host: the launch session (``host_session``: probe, stage, boot),
the supervisor and its one loop (``supervisor``, ``node_events``' pure decisions,
``node_inbox``), the supervisors' mesh (``peers`` over ``wire``), restarts and standbys,
the watchdog and what it records at a hang, the node's output, and how a node stops.
"""
