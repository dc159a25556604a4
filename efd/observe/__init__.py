"""What operators see: logs, metrics, the live stream, systemd notifications."""
