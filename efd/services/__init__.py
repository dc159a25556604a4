"""Background services: periodic jobs and the deletion-request runner."""
