"""Stand-in: NSA index buffers (no NSA pool here)."""
