"""The quarantine on this machine: ``store`` keeps its file (next to the run registry);
``ends`` decides from a run's end which hosts go in it; ``spares`` puts a spare in the place
of a host a launch cannot use (unreachable, quarantined) before the plan is made."""
