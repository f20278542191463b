"""Reaching hosts: transports (SSH, local), host keys, the host pool and its fan-out, the
calls that run shipped host-side code, and a host's launch session."""
