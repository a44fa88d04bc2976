"""Stand-in package: type names only."""
