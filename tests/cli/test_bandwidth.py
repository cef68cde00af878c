"""The memory-bandwidth probe of ``roicore bench --scaling``."""
import numpy as np
import pytest


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("nbytes", [8, 64, 4096, 4104, 100_000, (1 << 20) + 24])
def test_bandwidth_probe_passes_over_the_whole_buffer(nbytes, n_threads):
    """The probe behind ``roicore bench --scaling``'s memory-bandwidth table: its stores
    write every byte (non-zero bytes, over a zeroed buffer) and its read sees every word,
    whatever the buffer size and thread count."""
    from roicore.cli import _bandwidth
    modes = _bandwidth.PROBE_MODES
    assert sorted(modes) == ["plain stores", "reads", "streaming stores"]
    buf = np.zeros(nbytes, np.uint8)
    for kind in ("streaming stores", "plain stores"):
        buf[:] = 0
        assert _bandwidth.bandwidth_probe(buf, modes[kind], n_threads) == 0
        assert buf.all(), f"{kind} left {np.count_nonzero(buf == 0)} bytes unwritten"
    buf[:] = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
    assert _bandwidth.bandwidth_probe(buf, modes["reads"], n_threads) == buf.view(np.int64).sum()
