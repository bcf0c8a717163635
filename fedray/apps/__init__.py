"""Applications built on :func:`fedray.engine.runner.run_experiment`."""
