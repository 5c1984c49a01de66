"""Numerics: the NVFP4 format, its roundings, scales, random bits and Hadamard transform.

The bottom floor of fp4jax (docs/ARCHITECTURE.md): these modules import nothing of
ours outside this package, so the pure-JAX reference and the Pallas kernels can both
build on them. Import the submodules directly; this package re-exports nothing.
"""
