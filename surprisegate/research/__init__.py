"""Evaluation and benchmark tooling: labelling, calibration, the A/B harness, and the benchmarks.

Not imported by the runtime (the loop, backends, arms, stores, CLI of `ask`/`serve`): the CLI's
`label`, `calibrate`, `eval` and `bench` commands import it on use.
"""
