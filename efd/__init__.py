"""efd: an event-forwarding daemon. Segment-compatible ingestion, durable store, signed
webhook delivery with retries."""

from importlib import metadata


def _version() -> str:
    # The one version is pyproject.toml's, as installed; a source tree on PYTHONPATH without
    # an install (bench --src) has none to read.
    try:
        return metadata.version("efd")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
