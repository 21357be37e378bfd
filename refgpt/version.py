"""refgpt's version: one place, read by setup.cfg, the CLI's --version and golden files."""

__version__ = "0.2.0"
