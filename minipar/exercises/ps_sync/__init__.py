"""Exercise: a synchronous parameter server's push/pull (skeleton, reference solution, grader)."""
