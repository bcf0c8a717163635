"""Client runtimes: how a worker runs a task (sequential, grouped for multi-client, split)."""
