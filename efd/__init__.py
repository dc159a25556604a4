"""efd: an event-forwarding daemon. Segment-compatible ingestion, durable store, signed
webhook delivery with retries."""

__version__ = "0.1.0"
