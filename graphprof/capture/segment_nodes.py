"""CaptureRecords for the graphs AOTAutograd hands a segmented capture.

AOTAutograd keeps, on every node, the module stack dynamo saw
(``nn_module_stack``; ``fwd_nn_module_stack`` on backward nodes) and the
user's stack trace. They become the same ``CaptureRecord`` a whole-step graph
carries, so the passes after capture do not know which front end ran.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import torch
import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.records import CAPTURE, CaptureRecord
from graphprof.profile.model import GraphKind, Phase

_TORCH_DIR = os.path.dirname(torch.__file__)
_OPTIM_DIR = os.path.join(_TORCH_DIR, "optim")
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_ROOT_PREFIX = re.compile(r"^(?:L|G)\['[^']*'\](?:\.__self__)?\.?")  # the compiled forward's module


def _module_of(meta: dict[str, Any]) -> tuple[str, str]:
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    path = _ROOT_PREFIX.sub("", str(path)).replace("['", ".").replace("']", "")
    path = re.sub(r"\._modules\.|\._modules$", ".", path).replace("..", ".").strip(".")
    name = mtype.__name__ if isinstance(mtype, type) else str(mtype).rsplit(".", 1)[-1].strip("'>")
    return path, name


def _frames(meta: dict[str, Any]) -> list[tuple[str, int]]:
    return [(f, int(line)) for f, line in _FRAME.findall(meta.get("stack_trace") or "")]


def user_source(filename: str, line: int) -> str:
    """``file:line`` relative to the working directory when possible."""
    return f"{_relative(filename, os.getcwd())}:{line}"


@functools.lru_cache(maxsize=256)
def _relative(filename: str, cwd: str) -> str:
    """``filename`` relative to ``cwd``: cached, because host reads are named on every probed step.

    ``os.path.relpath`` took 12-15 us, as long as the read it names (an
    ``.item()`` of the demo GPT step's loss).
    """
    try:
        return os.path.relpath(filename, cwd)
    except ValueError:
        return filename


def caller_source(frame: Any) -> str:
    """``file:line`` of the innermost frame outside torch and graphprof: the user's call."""
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _OWN_DIR)):
        frame = frame.f_back
    return user_source(frame.f_code.co_filename, frame.f_lineno) if frame is not None else ""


def _source_of(frames: list[tuple[str, int]]) -> str:
    for filename, line in reversed(frames):
        if not filename.startswith((_TORCH_DIR, _OWN_DIR)):
            return user_source(filename, line)
    return ""


def write_capture_records(gm: torch.fx.GraphModule, kind: GraphKind, root_type: str = "",
                          call_source: str = "") -> None:
    """A CaptureRecord on every op node, from AOTAutograd's node metadata.

    ``root_type`` names the module whose forward was compiled: an op with no
    module stack (a backward op AOTAutograd did not map back) still ran
    inside that module. Dynamo leaves frames inside ``torch/nn/modules`` out
    of stack traces, so an op of torch's own modules has none; it gets
    ``call_source``, the user's line that called the module.
    """
    for node in gm.graph.nodes:
        if not is_op_node(node):
            continue
        module, module_type = _module_of(node.meta)
        if not module_type and root_type:
            module_type = root_type
        frames = _frames(node.meta)
        if kind is GraphKind.FORWARD:
            phase = Phase.FORWARD
        elif kind is GraphKind.BACKWARD:
            phase = Phase.BACKWARD
        elif any(f.startswith(_OPTIM_DIR) for f, _ in frames):
            phase = Phase.OPTIMIZER
        else:
            phase = Phase.FORWARD if module_type else Phase.OTHER
        node.meta[CAPTURE] = CaptureRecord(module, module_type, _source_of(frames) or call_source, phase, "")


def first_source(gm: torch.fx.GraphModule) -> str:
    """The source line of the first op node that has one: where the segment starts."""
    for node in gm.graph.nodes:
        record = node.meta.get(CAPTURE) if is_op_node(node) else None
        if record is not None and record.source:
            return record.source
    return ""


def last_source(gm: torch.fx.GraphModule) -> str:
    """The source line of the last op node that has one: where the segment ends."""
    for node in reversed(list(gm.graph.nodes)):
        record = node.meta.get(CAPTURE) if is_op_node(node) else None
        if record is not None and record.source:
            return record.source
    return ""
