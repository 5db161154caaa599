"""Exercise: which activations to keep under a memory budget (remat; ends notebook 09)."""
