"""kernels/pallas package."""
