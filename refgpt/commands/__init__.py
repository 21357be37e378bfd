"""The refgpt command's subcommands, one module each (see refgpt/cli.py)."""
