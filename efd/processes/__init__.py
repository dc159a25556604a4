"""Child processes: a pool of workers over pipes, and the ingestion parsers on it."""
