"""Exercise: the Megatron tensor-parallel MLP, forward and backward (skeleton, solution, grader)."""
