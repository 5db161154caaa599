"""Exercise: the dispatch/combine all-to-all of expert parallelism (skeleton, solution, grader)."""
