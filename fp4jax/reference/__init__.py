"""The pure-JAX reference: NVFP4 quantization and GEMMs as the spec, in plain JAX.

Floor 1 (docs/ARCHITECTURE.md): imports only `fp4jax.numerics`. Every other
implementation (the Pallas kernels, the Blackwell path) is tested against it.
"""
