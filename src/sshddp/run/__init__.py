"""One run's life on the coordinator: inputs, payload, preflight, boot, follow, teardown,
registry and sinks, sequenced by ``coordinator``; ``runs`` for runs already going."""
