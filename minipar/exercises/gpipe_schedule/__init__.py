"""Exercise: the GPipe pipeline schedule as a list of instructions (skeleton, solution, grader)."""
