"""Exercise: the zero-bubble ZB-H1 pipeline schedule (B and W apart) as a list of instructions."""
