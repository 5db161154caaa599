"""Exercise: binomial-tree broadcast (skeleton, reference solution, grader)."""
