"""Command-line tools that are not entry points of a run (ahead-of-time compilation)."""
