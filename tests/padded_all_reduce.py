"""A collective in one class, for the tests of the Collective protocol (unit and Gloo worlds):
every rank zeroes all but its own range of the buffer, one all-reduce (sum) fills it."""

from __future__ import annotations

import torch

from zero_lab.collectives import InFlight
from zero_lab.comm import Communicator


class PaddedAllReduce:
    """Every rank zeroes all but its own range; one all-reduce (sum) fills the buffer."""

    name = "all_reduce"
    label = "exchange_all_reduce"
    in_place_shards = False

    def issue(self, comm: Communicator, storage: torch.Tensor, bounds, op: str) -> InFlight:
        start, stop = bounds[comm.rank]
        storage[:start].zero_()
        storage[stop:].zero_()
        return InFlight(comm.issue_all_reduce(storage, op=op))

    def nbytes(self, bounds, itemsize: int) -> int:
        return bounds[-1][1] * itemsize
