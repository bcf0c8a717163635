"""Applications built on :func:`fedray.driver.runner.run_experiment`."""
