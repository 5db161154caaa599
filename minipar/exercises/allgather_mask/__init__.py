"""Exercise: the load-balanced causal mask of all-gather context parallelism (notebook 07)."""
