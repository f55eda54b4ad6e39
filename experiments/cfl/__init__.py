"""CFL recognition with length generalisation: looped vs looped + padding vs fixed depth (README.md)."""
