"""sshddp's test lab: real OpenSSH servers on loopback and hosts in network namespaces.

Shared by the test suite and the benchmarks; it imports only the standard library (and
PyYAML), never pytest and never sshddp, so it describes the machines, not the code under
test.
"""
