"""The commands: the CLI and what each subcommand runs.
"""
