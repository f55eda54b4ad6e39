"""seqmodels: pretraining and ablating long-context sequence models with memory, in JAX."""
