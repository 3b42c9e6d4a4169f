"""Where registry models come from, one module per source."""
