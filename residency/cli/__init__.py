"""The command line: one wiring point (`residency.cli.main`) for every subcommand; `python -m
residency` runs it."""
