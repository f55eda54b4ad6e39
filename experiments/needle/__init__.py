"""Needle in a haystack at 1x, 2x and 4x the training length (README.md)."""
