"""Exercise: the process grid's coordinates and Split groups (skeleton, solution, grader)."""
