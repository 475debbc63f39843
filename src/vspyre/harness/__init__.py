"""The parity harness layer: models to run, and the jobs that run them on the card."""
