"""One fake-tensor mode for the output metadata make_fx records during a real-tensor trace.

make_fx keeps each op output's shape, strides and dtype as a fake tensor in
``node.meta["val"]``. Tracing real tensors, there is no fake mode to make it
in, so torch's ``proxy_tensor.extract_val`` builds a new ``FakeTensorMode``
for every output tensor, and building one records the Python stack
(``traceback.extract_stack``). Inside a Hugging Face model's deep call
stacks that was a millisecond per op: about 2,000 stacks per capture of a
two-layer T5 training step, an eighth of the capture's time.

``one_fake_mode()`` lets that code make its fake tensors in one mode for
the length of a capture: the same ``empty_strided`` in a mode made the same
way, so the same metadata. torch's other uses of the class (fake and
symbolic tracing, isinstance checks) are untouched: only a call with
exactly the arguments ``extract_val`` passes is served the shared mode. If
this torch does not make its fake values that way, nothing is changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.fx.experimental import proxy_tensor

#: The arguments ``extract_val`` makes its per-tensor mode with.
_METADATA_MODE_ARGUMENTS: dict[str, Any] = {"allow_fallback_kernels": True}


@contextmanager
def one_fake_mode() -> Iterator[None]:
    """For the ``with`` block, make_fx's metadata for real tensors is made in one fake mode."""
    original: Any = getattr(proxy_tensor, "FakeTensorMode", None)
    if not isinstance(original, type):
        yield
        return
    shared: Any = None

    class _OneForMetadata(original):  # type: ignore[misc]  # a class that torch defines
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            nonlocal shared
            if args or kwargs != _METADATA_MODE_ARGUMENTS:
                return original(*args, **kwargs)  # another use: a mode of its own, as before
            if shared is None:
                shared = original(**kwargs)
            return shared  # not an instance of this class: __init__ does not run again

    setattr(proxy_tensor, "FakeTensorMode", _OneForMetadata)  # noqa: B010 - torch's own name, swapped back below
    try:
        yield
    finally:
        setattr(proxy_tensor, "FakeTensorMode", original)  # noqa: B010

