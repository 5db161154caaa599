"""Exercise: ring all-reduce (skeleton, reference solution, grader)."""
