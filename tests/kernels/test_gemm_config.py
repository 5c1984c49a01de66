"""The GEMM's tuning (`pallas_kernels.gemm_config`): validation and default choice."""

import pytest

from pallas_kernels import gemm_config as gc


def test_config_validation():
    with pytest.raises(ValueError, match="tile_m"):
        gc.TuningConfig(tile_m=96)
    with pytest.raises(ValueError, match="max_concurrent_steps"):
        gc.TuningConfig(max_concurrent_steps=1)
    with pytest.raises(ValueError, match="epi_tile_n"):
        gc.TuningConfig(epi_tile_n=48)


def test_default_config_divides_the_problem():
    """The pipelined tiles where they divide M, N and K; else the serial mainloop's."""
    assert gc.default_config(8192, 8192, 8192) == gc.PIPELINED_CONFIG
    assert gc.default_config(8192, 8192, 8192 + 64) == gc.LARGE_CONFIG
    assert isinstance(gc.default_config(16, 8192, 8192), gc.SkinnyConfig)
    assert gc.default_config(16, 8192, 8192, skinny=False) == gc.SKINNY_CONFIG
    cfg = gc.default_config(384, 640, 1152)  # non-power-of-two multiples of 128
    assert 384 % cfg.cta_tile_m == 0 and 640 % cfg.cta_tile_n == 0
