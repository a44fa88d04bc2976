"""Stand-in: the sglang package (its own imports the whole runtime)."""
