"""The quarantine on this machine: ``store`` keeps its file (next to the run registry);
``ends`` decides from a run's end which hosts go in it."""
