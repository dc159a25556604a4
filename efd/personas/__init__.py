"""Profiles, audiences and computed traits: what they compute and how they are synced."""
