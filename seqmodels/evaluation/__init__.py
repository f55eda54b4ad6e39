"""Evaluation suites over a trained run (``eval.py``): each suite maps (model, config) to a JSON dict."""
