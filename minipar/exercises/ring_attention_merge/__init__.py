"""Exercise: ring attention's online-softmax merge (skeleton, reference solution, grader)."""
