"""Exercise: DeepSeek-V3's top-k choice by s + b and the loss-free bias update (skeleton, solution, grader)."""
