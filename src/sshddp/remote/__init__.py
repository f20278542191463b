"""Stdlib-only scripts that run on the hosts (Python 3.8+), shipped over the connection.

They are never imported by the coordinator: ``sshddp.scripts`` reads their source and sends
``common.py`` followed by one script to the host's interpreter.
"""
