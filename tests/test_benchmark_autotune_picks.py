"""benchmarks/autotune_picks.py: reading XLA's autotuning results and comparing two."""

import gzip

import pytest

from benchmarks import autotune_picks

_DOT = r'"HloModule m\n{ p = bf16[8,8] parameter(0), s = \"x{\" }"'


def _results(*entries):
    """An `xla.AutotuneResults` text proto of (hlo literal, pick lines, nanos) entries
    (a test fixture written as XLA writes them: run time first, then the pick)."""
    body = "".join(
        f'results {{\n  device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz"\n  hlo: {hlo}\n'
        f"  result {{\n    run_time {{\n      nanos: {nanos}\n    }}\n"
        f"    scratch_bytes: 1024\n{pick}  }}\n}}\n"
        for hlo, pick, nanos in entries)
    return f"version: 3\n{body}"


_TRITON = "    triton {\n      block_m: 64\n      block_n: 128\n      num_warps: 4\n    }\n"
_GEMM = "    gemm {\n      algorithm: 13\n    }\n"


def test_picks_keys_each_entry_by_device_and_hlo_and_drops_the_timings():
    """Nested blocks, escaped quotes and braces inside the HLO string are read as one
    entry; the run time and scratch size are not part of the pick."""
    text = _results((_DOT, _TRITON, 31744), ('"{ other }"', _GEMM, 900))
    got = autotune_picks.picks(text)
    assert len(got) == 2
    dot = next(k for k in got if "parameter" in k[1])
    assert got[dot] == "triton { block_m: 64 block_n: 128 num_warps: 4 }"
    assert "nanos" not in " ".join(got.values()) and "scratch" not in " ".join(got.values())
    with pytest.raises(ValueError, match="without device, hlo or result"):
        autotune_picks.picks('results {\n  device: "d"\n}\n')


def test_compare_counts_shared_keys_and_lists_the_different_picks(tmp_path, capsys):
    """Two files that tuned one HLO alike (other run times) and one differently, each
    with an HLO of its own: two shared keys, one differing; gzipped files are read."""
    a = _results((_DOT, _TRITON, 100), ('"{ b }"', _GEMM, 5), ('"{ only a }"', _GEMM, 1))
    b = _results((_DOT, _TRITON.replace("64", "128"), 99), ('"{ b }"', _GEMM, 7),
                 ('"{ only b }"', _GEMM, 1))
    pa, pb = tmp_path / "1-pure_llama.textproto.gz", tmp_path / "2-pure_llama.textproto"
    pa.write_bytes(gzip.compress(a.encode()))
    pb.write_text(b)
    shared, differ = autotune_picks.compare(autotune_picks.read_picks(pa),
                                            autotune_picks.read_picks(pb))
    assert shared == 2 and len(differ) == 1
    assert differ[0][0] == "HloModule m" and "block_m: 64" in differ[0][1]
    assert "block_m: 128" in differ[0][2]
    assert autotune_picks.main([str(pa), str(pb)]) == 0
    assert "2 tuned in both, 1 of them picked differently" in capsys.readouterr().out
