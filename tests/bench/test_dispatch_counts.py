"""benchmarks/dispatch_counts.py: what it counts as an operator and as a host sync on CPU."""

import torch

from benchmarks.dispatch_counts import DispatchCounts


def test_each_aten_operator_is_counted_once():
    x = torch.ones(4)
    with DispatchCounts() as counts:
        y = x + 1
        y.mul_(2)
    assert counts.ops == 2
    assert counts.host_syncs == 0


def test_reading_values_into_python_counts_as_host_syncs():
    x = torch.arange(8)
    with DispatchCounts() as counts:
        x.tolist()
        int(x[0])
        bool(x[1] > 0)
        x[2].item()
        x.cpu()
        x.to("cpu", torch.long)
        x[x > 3]  # the output's size comes from the data
    assert counts.host_syncs == 7


def test_work_that_stays_on_the_device_has_no_host_sync():
    logits = torch.randn(16, 100)
    with DispatchCounts() as counts:
        ids = torch.argmax(torch.softmax(logits / 0.7, dim=-1), dim=-1)
        torch.where(ids > 5, ids, torch.zeros_like(ids))
    assert counts.host_syncs == 0
    assert counts.ops >= 4
