"""Adapters for training and rollout frameworks. Each imports its framework only when used."""
