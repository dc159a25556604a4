"""Pure rules: validation, routing, body shaping, signing, retry, filters (no I/O)."""
