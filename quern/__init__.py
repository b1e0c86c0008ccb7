"""The `quern` command: a thin root that hands each subcommand to the package that owns it."""
