"""A formatted number the step only prints or logs is formatted by the replay: one graph, eager's text.

``print(f"step {n} loss {loss.item():.4f}")`` (or ``log.info(f"...")``) on
every call used to refuse the capture (the loss is known only once the
replay ran), and the step ran as segments on every call; ``print(f"step
{n}")`` kept its text as a guard, which changed on every call. The replay's
output node now formats the replay's numbers into the text, also through
a local name only ``print`` reads (test_stored_texts.py). A text that goes
anywhere else (changed, given to a ``print`` or an ``info`` of the user's own, or to a logger behind a property), or that the
replay could not format as eager did (a computed spec, a conversion with a
spec), refuses as before: segments, one warning, eager's text. A
``%``-formatted text (``print("loss: %.3f" % loss.item())``) is formatted in
C, so it is read back from the string; one that reads back in two ways
refuses.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Any, Callable

import pytest
import torch

import graphprof

CALLS = 6


def _run(body: Callable[[torch.Tensor, dict[str, Any]], None], traced: bool) -> tuple[str, list[Any], Any, list[str]]:
    """Printed text, the weights after every call, the traced function and graphprof's warnings."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    state: dict[str, Any] = {"n": 0, "sched": sched, "precision": 3}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        state["n"] += 1
        body(loss, state)
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    out, weights = io.StringIO(), []
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        for i in range(CALLS):
            fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
            weights.append(model.weight.detach().clone())
    return out.getvalue(), weights, fn, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def _compare(body: Callable[[torch.Tensor, dict[str, Any]], None]) -> tuple[Any, list[str], str]:
    eager_text, eager_weights, _, _ = _run(body, traced=False)
    text, weights, traced, messages = _run(body, traced=True)
    assert text == eager_text
    assert all(torch.equal(a, b) for a, b in zip(eager_weights, weights))
    return traced, messages, text


def _every_call(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print(f"step {state['n']} loss {loss.item():.4f} lr {state['sched'].get_last_lr()[0]:.2e}")


def _clipped_norm(loss: torch.Tensor, state: dict[str, Any]) -> None:
    norm = torch.nn.utils.clip_grad_norm_(state["sched"].optimizer.param_groups[0]["params"], 0.5)
    print(f"grad norm {norm:.3f} loss {loss:.4f}")


def _forms(loss: torch.Tensor, state: dict[str, Any]) -> None:
    # A tensor formatted as its number, plain and converted values, and print's own arguments.
    print(f"{loss:.3f}", f"{loss.item()}", f"{loss.item()!r}|{loss.item()!s}", sep=" / ", end=";\n")
    print("two values:", f"{loss.item():>12.5e} {state['n']:03d}", flush=True)


def _str_format(loss: torch.Tensor, state: dict[str, Any]) -> None:
    # The PyTorch examples' form (MNIST): ``str.format`` of a constant string, straight to print.
    print("Train step: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(state["n"], state["n"] * 8, 80,
                                                                  100.0 * state["n"] / 10, loss.item()))


def _percent(loss: torch.Tensor, state: dict[str, Any]) -> None:
    # The older tutorials' form (CIFAR-10): ``%``-formatting of a constant string, straight to print.
    print("[%d, %5d] loss: %.3f" % (state["n"] // 3 + 1, state["n"], loss.item()))
    print("%s=%s" % ("loss", loss.item()), "%e|%-12g|%r" % (loss.item(), loss.item() * 1e6, loss.item()))
    print("acc %d%% (%x)" % (100 * loss.item(), state["n"]), "%.2f" % 3.14159)


def _kept(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = f"loss {loss.item():.4f}"  # the text reaches a local name, and that only print (test_stored_texts.py)
    print(line)


def _format_kept(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = "loss {:.4f}".format(loss.item())
    print(line)


@pytest.mark.parametrize("body", [_every_call, _clipped_norm, _forms, _str_format, _percent, _kept, _format_kept],
                         ids=["every call", "clipped norm", "forms", "str.format", "percent", "kept",
                              "str.format kept"])
def test_a_printed_formatted_loss_replays_one_graph_with_eagers_text(body: Callable[..., None]) -> None:
    traced, messages, text = _compare(body)
    assert len(set(text.splitlines())) == len(text.splitlines())  # each call's own numbers
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def _changed(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print(f"loss {loss.item():.4f}".upper())


def _computed_spec(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print(f"loss {loss.item():.{state['precision']}f}")


def _converted_and_padded(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print(f"loss {loss.item()!r:>24}")


def _in_a_list(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print(*[f"loss {loss.item():.4f}"])


def _format_computed_spec(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("loss {:.{}f}".format(loss.item(), state["precision"]))


def _percent_kept(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = "loss %.4f" % loss.item()
    print(line)


def _percent_by_name(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("%(loss).4f" % {"loss": loss.item()})


def _percent_padded(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("%-24s|" % (loss.item(),))  # compiled as an f-string's ``!s`` with a width: it would pad the marker


@pytest.mark.parametrize("body", [_changed, _computed_spec, _converted_and_padded, _in_a_list,
                                  _format_computed_spec, _percent_kept, _percent_by_name, _percent_padded],
                         ids=["changed", "computed spec", "converted and padded", "in a list",
                              "str.format with a computed spec", "percent kept", "percent by name",
                              "percent padded"])
def test_a_text_that_is_not_only_printed_refuses_with_eagers_text(body: Callable[..., None]) -> None:
    traced, messages, text = _compare(body)
    assert len(text.splitlines()) == CALLS
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "of a value read from a tensor" in messages[0], messages


def test_a_percent_formatted_text_read_back_in_two_ways_refuses_with_eagers_text() -> None:
    """``%`` formats in C: the text is read back from the string, and ``"0 0"`` could hold the loss's
    ``0`` in either place. Which one the replay should format is unknown, so the step refuses."""
    def body(loss: torch.Tensor, state: dict[str, Any]) -> None:
        print("%d %d" % (loss.item() * 0, 0))

    traced, messages, text = _compare(body)
    assert text.splitlines() == ["0 0"] * CALLS
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "formatting at" in messages[0] and "test_printed_texts.py" in messages[0], messages


def test_a_percent_formatted_text_that_another_argument_also_reads_as_refuses() -> None:
    """``print("2", "%d" % n)`` captured with n 2: the constant "2" reads back as n's text too; taking it
    for n's printed "3 2" where eager printed "2 3" on the next call."""
    def body(loss: torch.Tensor, state: dict[str, Any]) -> None:
        print("2", "%d" % state["n"])

    traced, messages, text = _compare(body)
    assert text.splitlines() == [f"2 {n}" for n in range(1, CALLS + 1)]
    assert traced.capture_mode == "segments" and len(messages) == 1, messages


def test_a_print_of_the_users_own_gets_the_real_text() -> None:
    """A ``print`` the step's code names itself (``from rich import print``) is not Python's: it would
    be handed the replay's marker. The text refuses, and that print sees eager's text every call."""
    seen: list[str] = []

    def own_print(*args: Any) -> None:
        seen.append(" ".join(map(str, args)))

    namespace: dict[str, Any] = {"print": own_print}
    exec("def body(loss, state):\n    print(f'loss {loss.item():.4f}')\n", namespace)
    _run(namespace["body"], traced=False)
    eager_seen = list(seen)
    seen.clear()
    _, _, traced, messages = _run(namespace["body"], traced=True)
    assert seen == eager_seen and len(seen) == CALLS
    assert traced.capture_mode == "segments" and len(messages) == 1, messages


def test_a_local_named_print_is_not_taken_for_pythons() -> None:
    seen: list[str] = []

    def body(loss: torch.Tensor, state: dict[str, Any]) -> None:
        print = seen.append
        print(f"loss {loss.item():.4f}")

    _run(body, traced=False)
    eager_seen = list(seen)
    seen.clear()
    _, _, traced, messages = _run(body, traced=True)
    assert seen == eager_seen and all("graphprof" not in s for s in seen)
    assert traced.capture_mode == "segments" and len(messages) == 1, messages


def test_a_printed_counter_and_loss_on_a_logging_path_replay_their_graphs() -> None:
    """``if n % 3 == 0: print(...)``: two paths, two graphs, no call runs as segments."""
    def every_third(loss: torch.Tensor, state: dict[str, Any]) -> None:
        if state["n"] % 3 == 0:
            print(f"call {state['n']} loss {loss.item():.4f}")

    traced, messages, text = _compare(every_third)
    assert len(text.splitlines()) == CALLS // 3
    assert messages == [] and traced.captures == 2 and traced.capture_mode == "whole-step"


_LOG = logging.getLogger("graphprof.tests.printed_texts")


class _Recorder:
    """Not a logger: an ``info`` of the user's that keeps what it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


class _WithProperty:
    @property
    def logger(self) -> logging.Logger:
        return _LOG


def _logged(body: Callable[[torch.Tensor, dict[str, Any]], None], traced: bool) -> tuple[list[str], Any, list[str]]:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    _LOG.addHandler(handler)
    _LOG.setLevel(logging.INFO)
    try:
        _, _, fn, messages = _run(body, traced)
    finally:
        _LOG.removeHandler(handler)
    return records, fn, messages


@pytest.mark.parametrize("form", ["f-string", "str.format", "percent", "logging's arguments"])
def test_a_formatted_loss_logged_by_a_logger_replays_one_graph(form: str) -> None:
    def body(loss: torch.Tensor, state: dict[str, Any]) -> None:
        if form == "f-string":
            _LOG.info(f"step {state['n']} loss {loss.item():.4f}")
        elif form == "str.format":
            _LOG.info("step {} loss {:.4f}".format(state["n"], loss.item()))
        elif form == "percent":
            _LOG.info("step %d loss %.4f" % (state["n"], loss.item()))
        else:
            _LOG.info("step %d loss %.4f", state["n"], loss.item())

    eager, _, _ = _logged(body, traced=False)
    records, traced, messages = _logged(body, traced=True)
    assert records == eager and len(set(records)) == CALLS
    assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 1


def test_an_info_that_is_not_a_loggers_gets_the_real_text() -> None:
    """An object of the user's with an ``info`` method, or a logger behind a property (which would run
    the user's code to find): the text refuses, and what they keep is eager's."""
    recorder, holder = _Recorder(), _WithProperty()

    def kept(loss: torch.Tensor, state: dict[str, Any]) -> None:
        recorder.info(f"loss {loss.item():.4f}")

    _run(kept, traced=False)
    eager = list(recorder.lines)
    recorder.lines.clear()
    _, _, traced, messages = _run(kept, traced=True)
    assert recorder.lines == eager and len(eager) == CALLS
    assert traced.capture_mode == "segments" and len(messages) == 1, messages

    def behind_a_property(loss: torch.Tensor, state: dict[str, Any]) -> None:
        holder.logger.info(f"loss {loss.item():.4f}")

    eager, _, _ = _logged(behind_a_property, traced=False)
    records, traced, messages = _logged(behind_a_property, traced=True)
    assert records == eager and len(records) == CALLS
    assert traced.capture_mode == "segments" and len(messages) == 1, messages
