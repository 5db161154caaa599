"""Exercise: a ZeRO-1 optimizer step (skeleton, reference solution, grader)."""
