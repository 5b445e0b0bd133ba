"""Data, not code: the model registry and the drafts mlxspec ships, with their model cards.

A package so they travel inside the wheel."""
