"""Pure data and decisions, no I/O: inventory, plan, commands, checks, states, reports.

Everything here is tested without SSH. It imports only the standard library, PyYAML (to
read an inventory's text), ``sshddp.errors``, ``sshddp.defaults`` and the host contract
(``sshddp.protocol.contract``).
"""
