"""AHN on SmolLM2-135M-Instruct: distillation runs and their evaluation (README.md)."""
