"""The autocast regions a call is made in: read, and entered again around a call made elsewhere.

Why: a graph traced inside ``torch.autocast`` holds its casts and one
traced outside holds none, so the regions around a traced call are part of
the key its graphs are kept under (capture/signature.py), like the grad
mode. And a forward recorded as one op that runs the live module in every
replay (capture/fast_paths.py) is called from a graph, not from the step:
the step's own ``with torch.autocast(...)`` around it is not entered then,
and the regions of the replay's caller are. It enters the regions its
capture call had instead, as eager's forward ran in them.
"""

from __future__ import annotations

import contextlib

import torch

#: Autocast regions as ``autocast_state`` gives them: (device, dtype) of each enabled one; None for none.
Regions = tuple[tuple[str, torch.dtype], ...] | None

_any_autocast = torch._C._is_any_autocast_enabled


def autocast_state() -> Regions:
    """The autocast regions the call is made in (device and dtype of each), None outside any."""
    if not _any_autocast():
        return None
    return tuple((device, torch.get_autocast_dtype(device)) for device in torch._C._autocast_supported_devices()
                 if torch.is_autocast_enabled(device))


def regions_entered(regions: Regions) -> contextlib.ExitStack:
    """A context inside ``regions`` and no other autocast region, whatever the regions around it are."""
    entered = contextlib.ExitStack()
    dtypes = dict(regions or ())
    for device in torch._C._autocast_supported_devices():
        if device in dtypes:
            entered.enter_context(torch.autocast(device, dtype=dtypes[device]))
        elif torch.is_autocast_enabled(device):
            entered.enter_context(torch.autocast(device, enabled=False))
    return entered
