"""Experiments: one folder per question asked of the models (driver ``run.py``, its report, README, results/)."""
