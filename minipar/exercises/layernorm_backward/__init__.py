"""Exercise: the layer norm's backward on each rank's rows, γ and β gradients summed."""
