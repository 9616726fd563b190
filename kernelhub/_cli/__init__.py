"""Subcommands of the `kernelhub` command (see kernelhub/cli.py)."""
