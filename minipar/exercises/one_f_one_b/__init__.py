"""Exercise: the 1F1B (PipeDream-Flush) pipeline schedule as a list of instructions."""
