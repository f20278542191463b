"""Jobs sshddp ships to the hosts and runs under torchrun (they need torch there)."""
