"""Sweeps: ``ablate.py``'s sweep files (``spec``), runs (``runner``), per-run evaluation (``evaluate``) and
reports (``report``)."""
