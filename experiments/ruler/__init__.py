"""RULER over the memory sweep's models: the sweep file's runs and their report (README.md)."""
