"""How a command of the ``graphprof`` process loads a profile: with the collector frozen over it.

Kept apart from the parser and the commands because it holds process-wide
state: whether this process froze the collector, and whether it keeps what it
loaded until it ends (``cli.run``) instead of freeing it object by object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphprof.render.escape import terminal_line

if TYPE_CHECKING:
    from graphprof.profile.model import Profile

#: What the running command loaded, kept until the process ends when ``keep_until_exit`` was called (None: not kept).
_held: list[Any] | None = None
#: Whether ``load_frozen`` froze the collector's view in this command: ``main`` thaws it again
#: when it was called in a longer-lived process (a test, a notebook), whose cycles must stay collectable.
_frozen = False


def load_frozen(path: str) -> "Profile":
    """Load a profile file (ProfileError: one sentence) and move everything alive into the collector's
    permanent generation.

    Why: a loaded profile is immutable and holds millions of objects; with the
    collector running, the first collection after the load walks all of them
    (a second on a million nodes) and every later full collection walks them
    again. Frozen, they are never walked. Only this process does so: it exits
    after one command, and a library caller's collector is left alone.
    """
    import gc

    from graphprof.profile.model import load_profile
    from graphprof.progress import stage

    global _frozen
    if _held is not None:  # this process ends with the command
        _keep_freed_memory()
    enabled = gc.isenabled()
    gc.disable()  # no collection at the end of the load either (the loader pauses it only while it reads)
    try:
        with stage(f"loading {terminal_line(path)}"):
            profile = load_profile(path)
    finally:
        gc.freeze()
        _frozen = True
        if enabled:
            gc.enable()
    if _held is not None:
        _held.append(profile)
    return profile


#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _keep_freed_memory() -> None:
    """Let the C allocator keep the memory freed while a profile loads, for the allocations after it.

    Why: a load parses hundreds of MB of JSON objects, converts them to arrays
    and drops them; glibc gives large freed blocks back to the system (each
    block above its mmap threshold, and the top of its heap), and every later
    allocation then faults fresh zeroed pages in again. Keeping them saves a
    quarter of a 100,000-node diff's page faults (117,000 to 88,000; 8% at a
    million nodes) for about a tenth more peak memory. Only a process that
    ends with its command does this (``keep_until_exit``); where the C library
    has no ``mallopt`` (not glibc) nothing changes.
    """
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        mallopt(_M_MMAP_THRESHOLD, 256 << 20)
        mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError, TypeError):
        pass


def load_for_analysis(path: str) -> "Profile":
    """Load a profile file (``load_frozen``) and insist it has nodes and profiled steps (ProfileError: one sentence)."""
    from graphprof.profile.model import require_samples

    profile = load_frozen(path)
    require_samples(profile, path)
    return profile


def thaw() -> None:
    """Undo ``load_frozen``'s freeze, unless the process ends with this command (``run``)."""
    global _frozen
    if _frozen and _held is None:
        import gc

        gc.unfreeze()
    _frozen = False


def keep_until_exit() -> None:
    """Keep every profile loaded from now on alive until the process ends (it then ends without freeing them)."""
    global _held
    _held = []
