"""What the step's modules hold, as a capture call found it: put back whole when the capture is not kept.

A step can change what a module holds, not only the values it holds:
``prune.remove(m, "weight")`` deletes the ``weight_mask`` buffer and the
``weight_orig`` parameter, registers ``weight`` anew and drops the plain
``weight`` attribute; ``del model.head`` takes a submodule away;
``model._buffers.pop("ema")`` a buffer; ``model.cache = ...`` adds an
attribute. A capture that is refused runs the step again (eagerly, or as
segments) from the state it put back, and eager's run must find the modules
as eager left them after the call before. Left as the capture call changed
them, that run differed from eager's, or raised where eager does not
(``prune.remove`` of a weight no longer pruned).

Watched values are put back one place at a time (capture/watched_state.py), and a
key put back that way goes to the end of its dict. These dicts are put back
whole instead: each module's ``__dict__`` and its parameter, buffer and
submodule dicts get the same keys, in the same order, holding the same
objects as before the call (``state_dict()``'s order, ``named_parameters()``'s,
``vars(module)``'s). The values inside them are the other undos' business:
tensors the write log's, the hook dicts' items capture/registered_hooks.py's.
A dict that did not change is left alone.
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import nn

#: The dicts in which ``nn.Module`` registers what it holds.
_REGISTERED = ("_parameters", "_buffers", "_modules")


class ModuleContents:
    """Each module's ``__dict__`` and registration dicts, with their items when the capture call began."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self._before: list[tuple[dict[str, Any], list[tuple[str, Any]]]] = []
        for module in modules:
            fields = vars(module)
            self._before.append((fields, list(fields.items())))
            for name in _REGISTERED:
                registered = fields.get(name)
                if type(registered) is dict:
                    self._before.append((registered, list(registered.items())))

    def restore(self) -> None:
        """Give every dict that changed its keys, order and objects back."""
        for target, items in self._before:
            if len(target) != len(items) or any(key != k or target[key] is not value
                                                for key, (k, value) in zip(target, items)):
                target.clear()
                target.update(items)
