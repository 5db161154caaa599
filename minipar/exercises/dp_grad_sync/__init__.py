"""Exercise: data-parallel gradient synchronisation (skeleton, reference solution, grader)."""
