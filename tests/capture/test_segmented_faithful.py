"""Segmented capture gives eager's results bitwise on CPU, attributes ops, and reports recompiles truthfully.

The steps are those that used to diverge when dynamo compiled the whole step:
Adam/AdamW after ``clip_grad_norm_`` with a logged norm, a branch on
``loss.item()``, a printed loss, Python ``random.Random`` draws deciding
whether to step, and Hugging Face models (BERT + AdamW, GPT-2 with gradient
checkpointing, dropout on). Each runs eagerly and under ``capture="dynamo"``
on identical copies for 8 calls; losses, logged values, parameters and
optimizer state must be equal bit for bit.
"""

from __future__ import annotations

import random
import sys
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import graphprof
from graphprof.analysis.advisor import advise
from graphprof.profile.model import GraphKind

N_CALLS = 8


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))


def _cnn_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(N_CALLS)]


def clip_logged_norm(model, opt, logs):
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        logs.append(norm.item())
        opt.step()
        return loss
    return step


def branch_on_loss(model, opt, logs):
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if loss.item() > 1.3:
            opt.step()
        return loss
    return step


def printed_loss(model, opt, logs):
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        sys.stdout.write(f"loss {loss.item():.6f}\n")  # not print: the replay would format that
        opt.step()
        return loss
    return step


def python_random(model, opt, logs):
    rng = random.Random(7)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if rng.random() < 0.7:
            opt.step()
        logs.append(rng.random())
        return loss
    return step


STEPS = [clip_logged_norm, branch_on_loss, printed_loss, python_random]


def _run(make_step, optimizer: str, capture: str | None):
    model = _cnn()
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=1e-2)
    logs: list[float] = []
    step = make_step(model, opt, logs)
    fn = graphprof.trace(step, capture=capture) if capture else step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [fn(x, y).detach().clone() for x, y in _cnn_batches()]
    return losses, logs, model, opt, fn, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def _assert_same_state(eager_model, eager_opt, model, opt) -> None:
    for p, q in zip(eager_model.parameters(), model.parameters()):
        assert torch.equal(p, q)
    for p, q in zip(eager_model.parameters(), model.parameters()):
        a, b = eager_opt.state.get(p, {}), opt.state.get(q, {})
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
@pytest.mark.parametrize("make_step", STEPS, ids=lambda f: f.__name__)
def test_segments_are_bitwise_with_adam(make_step, optimizer: str, capsys) -> None:
    eager_losses, eager_logs, eager_model, eager_opt, _, _ = _run(make_step, optimizer, None)
    eager_out = capsys.readouterr().out
    losses, logs, model, opt, fn, messages = _run(make_step, optimizer, "dynamo")
    assert fn.capture_mode == "segments"
    assert not messages  # nothing recompiled, nothing fell back
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses))
    assert logs == eager_logs and capsys.readouterr().out == eager_out
    _assert_same_state(eager_model, eager_opt, model, opt)
    profile = fn.get_profile()
    names = [g.name for g in profile.graphs]
    assert any(n.startswith("forward 1 (Sequential) at ") and "test_segmented_faithful.py:" in n for n in names)
    assert any(n.startswith("backward 1") for n in names)
    if make_step is not branch_on_loss:  # the loss may stay low: then no profiled step ran the optimizer
        assert "optimizer" in names


def test_python_random_step_falls_back_and_stays_bitwise() -> None:
    eager_losses, eager_logs, eager_model, eager_opt, _, _ = _run(python_random, "Adam", None)
    losses, logs, model, opt, fn, messages = _run(python_random, "Adam", "auto")
    assert fn.capture_mode == "segments" and len(messages) == 1 and "random" in messages[0]
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses)) and logs == eager_logs
    _assert_same_state(eager_model, eager_opt, model, opt)


def _module_share(profile) -> float:
    ops = [n for g in profile.graphs if g.kind is not GraphKind.HOST for n in g.nodes]
    return sum(1 for n in ops if n.module_type) / len(ops)


def _hf_model(name: str) -> tuple[nn.Module, list[dict]]:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "bert":
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64, num_labels=3)
        model = transformers.BertForSequenceClassification(config)
        batches = [dict(input_ids=torch.randint(0, 100, (4, 16), generator=g),
                        labels=torch.randint(0, 3, (4,), generator=g)) for _ in range(N_CALLS)]
    else:
        config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
        model.gradient_checkpointing_enable()
        ids = [torch.randint(0, 100, (4, 16), generator=g) for _ in range(N_CALLS)]
        batches = [dict(input_ids=i, labels=i) for i in ids]
    model.train()  # dropout on: the RNG stream must match too
    return model, batches


def _hf_run(name: str, capture: str | None):
    model, batches = _hf_model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    logs: list[float] = []

    def step(batch):
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        logs.append(nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
        opt.step()
        return loss

    fn = graphprof.trace(step, capture=capture) if capture else step
    torch.manual_seed(123)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        losses = [fn(b).detach().clone() for b in batches]
    return losses, logs, model, opt, fn


@pytest.mark.parametrize("name", ["bert", "gpt2-checkpointed"])
def test_hugging_face_segments_are_bitwise_and_attributed(name: str) -> None:
    eager_losses, eager_logs, eager_model, eager_opt, _ = _hf_run(name, None)
    losses, logs, model, opt, fn = _hf_run(name, "dynamo")
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses)) and logs == eager_logs
    _assert_same_state(eager_model, eager_opt, model, opt)
    profile = fn.get_profile()
    assert _module_share(profile) >= 0.9
    assert {"optimizer"} <= {g.name for g in profile.graphs}


class Gated(nn.Module):
    """A model whose forward reads a Python attribute: changing it makes dynamo compile again."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.double = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out * 2 if self.double else out


def test_recompile_is_reported_and_left_out_of_step_time() -> None:
    torch.manual_seed(0)
    model = Gated()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    fn = graphprof.trace(step, capture="dynamo")
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(8):
            model.double = call >= 5
            fn(x)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "compiled" in messages[0] and "double" in messages[0]
    profile = fn.get_profile()
    recompiles = profile.meta.recompiles
    assert recompiles is not None
    assert len(recompiles) == 1 and recompiles[0].call == 5 and recompiles[0].compile_time_s > 0
    step5 = [s.index for s in profile.steps].index(5)
    assert profile.steps[step5].wall_time_s < recompiles[0].compile_time_s  # the compile is not in the step
    for i, s in enumerate(profile.steps):  # graphs and host nodes add up to each step
        total = sum(n.host_time_s[i] for _, n in profile.iter_nodes())
        assert total == pytest.approx(s.wall_time_s, rel=1e-9)
    findings = [f for f in advise(profile) if f.rule == "recompiles"]
    assert len(findings) == 1 and findings[0].time_s == pytest.approx(recompiles[0].compile_time_s)


def test_segments_run_under_cprofile_and_leave_its_hook_in_place() -> None:
    """A user profiling the training loop with cProfile keeps their profiler; results stay eager's,
    and the step's host reads are still timed at their own line."""
    import cProfile
    eager_losses, eager_logs, eager_model, eager_opt, _, _ = _run(clip_logged_norm, "Adam", None)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        losses, logs, model, opt, fn, _ = _run(clip_logged_norm, "Adam", "dynamo")
    finally:
        profiler.disable()
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses)) and logs == eager_logs
    _assert_same_state(eager_model, eager_opt, model, opt)
    profile = fn.get_profile()
    assert profile.steps
    reads = [n for _, n in profile.iter_nodes() if n.op == "Tensor.item"]
    assert reads and all("test_segmented_faithful.py" in n.source for n in reads)


def test_demo_gpt_with_a_logged_loss_is_bitwise_and_attributed() -> None:
    """The demo GPT + AdamW step with its loss logged: eager's results, and 90% of op nodes with a module."""
    from graphprof.demo.steps import DEMO_STEPS

    def run(capture: str | None):
        demo = DEMO_STEPS["gpt"](seed=0)
        logs: list[float] = []

        def step(x, y):
            loss = demo.step_fn(x, y)
            logs.append(loss.item())
            return loss

        fn = graphprof.trace(step, capture=capture) if capture else step
        losses = [fn(*demo.make_inputs(i)).detach().clone() for i in range(5)]
        return losses, logs, demo, fn

    eager_losses, eager_logs, eager_demo, _ = run(None)
    losses, logs, demo, fn = run("dynamo")
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses)) and logs == eager_logs
    _assert_same_state(eager_demo.model, eager_demo.optimizer, demo.model, demo.optimizer)
    profile = fn.get_profile()
    assert _module_share(profile) >= 0.9
    assert {"optimizer"} <= {g.name for g in profile.graphs}


class _NumpyMasked(nn.Module):
    """Masks random time steps drawn with numpy in its forward, as wav2vec2's ``_compute_mask_indices``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy as np

        start = int(np.random.rand(1).item() * 4)  # an array, as transformers draws it
        keep = torch.ones(x.shape[1], 1)
        keep[start:start + 2] = 0.0
        return self.linear(x * keep)


def test_numpy_draws_in_a_compiled_forward_are_eager_s_draws() -> None:
    """Dynamo traces numpy into torch ops and draws from torch's generator: other numbers than eager's,
    and torch's stream moved. Segments leave numpy untraced, and the user's setting as it was."""
    import numpy as np

    def make() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = _NumpyMasked()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    setting = torch._dynamo.config.trace_numpy
    results = []
    for traced in (False, True):
        model, step = make()
        fn = graphprof.trace(step, capture="dynamo") if traced else step
        np.random.seed(0)
        torch.manual_seed(1)
        losses = [fn(torch.randn(3, 6, 6)) for _ in range(N_CALLS)]
        results.append((losses, [p.detach().clone() for p in model.parameters()], np.random.rand(),
                        torch.get_rng_state()))
    (losses_a, params_a, np_a, rng_a), (losses_b, params_b, np_b, rng_b) = results
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b))
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    assert np_a == np_b and torch.equal(rng_a, rng_b)
    assert torch._dynamo.config.trace_numpy == setting


def test_a_step_run_as_segments_keeps_the_distributions_argument_checks() -> None:
    """Dynamo's first compile turned ``torch.distributions``' checks off for the whole process: a step
    that fell back to segments trained on a NaN batch where eager raised ValueError."""
    from torch.distributions import Categorical, Distribution

    def make():
        torch.manual_seed(0)
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)

        def step(obs, act):
            loss = -Categorical(logits=policy(obs)).log_prob(act).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() > 100:  # refuses whole-step capture: the step runs as segments
                sys.stdout.write("large loss\n")
            return loss.detach()
        return step

    def outcomes(fn) -> list:
        out = []
        for i in range(5):
            obs = torch.full((2, 4), float(i))
            if i == 3:
                obs[0, 0] = float("nan")
            try:
                out.append(fn(obs, torch.tensor([0, 1])))
            except ValueError:
                out.append("ValueError")
        return out

    checks = Distribution._validate_args
    Distribution.set_default_validate_args(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager, traced = outcomes(make()), outcomes(graphprof.trace(make()))
        assert eager[3] == "ValueError"
        assert [r if isinstance(r, str) else r.tolist() for r in traced] == \
            [r if isinstance(r, str) else r.tolist() for r in eager]
        assert Distribution._validate_args  # and every later distribution of the process still checks
    finally:
        Distribution.set_default_validate_args(checks)


def test_lbfgs_with_a_closure_warns_once_and_matches_eager() -> None:
    """LBFGS reads its loss with ``float()`` inside ``step(closure)``: the step runs as segments, and its
    optimizer eagerly. That second fallback warned again, for the same reason; it is logged now."""
    def make():
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=3)

        def step(x, y):
            def closure():
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss
            return opt.step(closure).detach()
        return step, model

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"call {i}"
            assert all(torch.equal(p, q) for p, q in zip(eager_model.parameters(), model.parameters()))
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "torch.compile segments" in messages[0], messages


def test_a_random_instance_drawn_in_a_forward_draws_anew_in_every_segmented_call() -> None:
    """``self.rng.uniform(...)`` in a forward refuses whole-step capture; in the segments, dynamo made the
    compile's draw a constant of the graph, so every later call scaled by it and the generator stopped."""
    class Jitter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rng, self.body = random.Random(0), nn.Linear(4, 2)

        def forward(self, x):
            return self.body(x * self.rng.uniform(0.5, 1.5))

    def make():
        torch.manual_seed(0)
        model = Jitter()
        return (lambda x: model(x).sum().detach()), model

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(5):
            assert torch.equal(eager(torch.ones(2, 4)), traced(torch.ones(2, 4))), f"call {i}"
            assert eager_model.rng.getstate() == model.rng.getstate(), f"call {i}"
    assert traced.capture_mode == "segments"


class _MomentumEncoder(nn.Module):
    """MoCo's key encoder update, as its official code writes it: ``.data =`` inside the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 3)
        self.k = nn.Linear(4, 3).requires_grad_(False)
        self.k.load_state_dict(self.q.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for pk, pq in zip(self.k.parameters(), self.q.parameters()):
                pk.data = pk.data * 0.99 + pq.data * 0.01
        return (self.q(x) - self.k(x)).pow(2).mean()


def test_a_forward_torch_compile_cannot_compile_runs_eagerly_with_one_warning() -> None:
    """AOTAutograd refuses MoCo's ``.data =`` update ("a set_ on a graph input ... other mutations"):
    dynamo raised that into the step, after the segments before it had run. Now the frame runs as
    plain Python, with one warning that its ops are missing from the profile."""
    def make() -> tuple[Any, nn.Module]:
        torch.manual_seed(0)
        model = _MomentumEncoder()
        opt = torch.optim.SGD(model.q.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x)
            loss.backward()
            opt.step()
            return loss

        return step, model

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step, capture="dynamo")
    messages: list[str] = []
    for i in range(4):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(i))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(eager(x).detach(), traced(x).detach()), f"call {i}"
        messages += [str(w.message) for w in caught]
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert torch.equal(a, b), f"call {i}"
    assert len(messages) == 1 and "could not compile the forward of _MomentumEncoder" in messages[0]
    assert traced.get_profile() is not None


def test_an_optimizer_step_the_user_compiled_runs_as_the_user_compiled_it() -> None:
    """PyTorch's "compiling the optimizer" recipe: the step calls ``torch.compile(opt_step)``. Run as
    segments, that function saw graphprof's routed ``opt.step``, broke its graph there and ran
    graphprof's graph of eager's Adam: parameters 3.7e-8 away from eager's inductor update."""
    def make() -> tuple[Any, nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        @torch.compile
        def opt_step() -> None:
            opt.step()

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt_step()
            return loss.detach()

        return step, model, opt

    (eager, eager_model, eager_opt), (step, model, opt) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refused capture says once that the step runs as segments
        for i in range(5):
            g = torch.Generator().manual_seed(100 + i)
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"loss differs on call {i}"
            for a, b in zip(eager_model.parameters(), model.parameters()):
                assert torch.equal(a, b), f"parameters differ after call {i}"
            for sa, sb in zip(eager_opt.state.values(), opt.state.values()):
                assert all(torch.equal(sa[k], sb[k]) for k in sa), f"optimizer state differs after call {i}"
    assert traced.capture_mode == "segments"


class _TrainingModule(nn.Module):
    """A module whose forward is the whole training step, its optimizer's update included."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=0.01)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = nn.functional.mse_loss(self.net(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()


def test_an_optimizer_step_in_a_forward_graphprof_compiles_stays_routed() -> None:
    """Only the user's own compiled code sees the optimizer's step: in a forward graphprof compiles, dynamo
    traced Adam, and parameters left eager's from the first segmented call."""
    def make() -> tuple[Any, nn.Module]:
        torch.manual_seed(0)
        model = _TrainingModule()
        opt = model.opt

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            _ = opt  # named, so that its step is routed
            return model(x, y)

        return step, model

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step, capture="dynamo")
    for i in range(5):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        assert torch.equal(eager(x, y), traced(x, y)), f"loss differs on call {i}"
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"


@pytest.mark.parametrize("capture", ["auto", "dynamo"])
@pytest.mark.parametrize("traced_as", ["the module", "a step naming the module"])
def test_an_optimizer_a_module_keeps_is_found_without_being_named(capture: str, traced_as: str) -> None:
    """A module whose forward is a whole training step, with its optimizer at ``self.opt``: the step never
    names the optimizer, so it was not routed, dynamo traced Adam inside the compiled forward, and the
    parameters left eager's from the first segmented call, silently."""
    def make() -> tuple[Any, nn.Module]:
        torch.manual_seed(0)
        model = _TrainingModule()
        if traced_as == "the module":
            return model, model

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return model(x, y)

        return step, model

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step, capture=capture)
    for i in range(5):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        assert torch.equal(eager(x, y), traced(x, y)), f"loss differs on call {i}"
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"


def _sequential_scheduler_warnings(traced: bool) -> list[tuple[str, int]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.ConstantLR(opt), torch.optim.lr_scheduler.StepLR(opt, 2)], milestones=[2])

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        sched.step()
        return loss

    fn = graphprof.trace(step, capture="dynamo") if traced else step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            fn(torch.full((2, 4), float(i)))
    return [(str(w.message), w.lineno) for w in caught if "graphprof" not in str(w.message)]


def test_a_scheduler_first_stepped_in_a_segmented_call_finds_its_wrapper_on_the_optimizer() -> None:
    """An LR scheduler's first step warns when ``opt.step`` lacks the wrapper it put there; the routed
    step graphprof installs for segments lacked it, so ``SequentialLR``'s second scheduler, first
    stepped at its milestone, warned "Seems like optimizer.step() has been overridden", where eager
    did not."""
    assert _sequential_scheduler_warnings(True) == _sequential_scheduler_warnings(False)


def _accumulating_scheduled_run(traced: bool) -> tuple[list[str], nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    calls = [0]

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        if calls[0] % 2 == 1:  # gradients accumulated over two calls: the first opt.step() is the 2nd call's
            opt.step()
            sched.step()
            opt.zero_grad()
        calls[0] += 1
        return loss.detach()

    fn = graphprof.trace(step, capture="dynamo") if traced else step
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            losses.append(fn(torch.randn(2, 4, generator=torch.Generator().manual_seed(i))))
    messages = [str(w.message) for w in caught if "graphprof" not in str(w.message)]
    return messages, model, opt, (losses, sched.state_dict())


def test_an_optimizer_first_stepped_routed_counts_as_stepped_for_its_scheduler() -> None:
    """The routed step runs the class's step, not the scheduler's wrapper that sets ``opt._opt_called``:
    a program whose first ``opt.step()`` ran in a segmented call got the scheduler's "Detected call of
    ``lr_scheduler.step()`` before ``optimizer.step()``", where eager warned of nothing."""
    eager_warned, eager_model, eager_opt, (eager_losses, eager_sched) = _accumulating_scheduled_run(False)
    warned, model, opt, (losses, sched) = _accumulating_scheduled_run(True)
    assert warned == eager_warned == []
    assert getattr(opt, "_opt_called", None) is getattr(eager_opt, "_opt_called", None) is True
    assert all(map(torch.equal, eager_losses, losses))
    assert sched == eager_sched
    for a, b in zip(eager_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
        assert torch.equal(eager_opt.state[a]["momentum_buffer"], opt.state[b]["momentum_buffer"])


class _MaskedWrite(nn.Module):
    """A forward writing through a boolean mask: index_put's backward has a data-dependent shape, so
    AOTAutograd cannot compile it, and the frame runs eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.fill = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h[h[:, 0] > 0] = self.fill
        return h.sum()


def test_what_torch_warns_while_graphprof_compiles_is_not_shown_as_the_steps() -> None:
    """AOTAutograd traces a backward under anomaly mode; the compile that failed left two "Error detected
    in IndexPutBackward0" warnings of torch's beside graphprof's, where eager warns of nothing."""
    def make() -> tuple[Any, nn.Module]:
        torch.manual_seed(0)
        model = _MaskedWrite()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rng = random.Random(0)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x) * rng.random()  # Python's random: segments
            loss.backward()
            opt.step()
            return loss.detach()

        return step, model

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"call {i}"
    assert all(map(torch.equal, eager_model.parameters(), model.parameters()))
    assert [w for w in caught if "graphprof" not in str(w.message)] == []
    assert traced.capture_mode == "segments"


class _ListedOptimizerModule(nn.Module):
    """A whole training step as a forward, its optimizer kept in a list (``self.optimizers = [...]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.optimizers = [torch.optim.AdamW(self.net.parameters(), lr=0.01)]

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt = self.optimizers[0]
        opt.zero_grad()
        loss = nn.functional.mse_loss(self.net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()


def test_an_optimizer_a_module_keeps_in_a_list_is_found() -> None:
    """One kept in a list or dict was not found: dynamo compiled AdamW into the forward (1e-7 off)."""
    def make() -> nn.Module:
        torch.manual_seed(0)
        return _ListedOptimizerModule()

    eager_model, model = make(), make()
    traced = graphprof.trace(model, capture="dynamo")
    for i in range(5):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        assert torch.equal(eager_model(x, y), traced(x, y)), f"loss differs on call {i}"
        assert all(map(torch.equal, eager_model.parameters(), model.parameters())), f"call {i}"


class _GANStep(nn.Module):
    """A GAN whose forward is the whole training step, both optimizers kept on it (pix2pix's
    ``optimize_parameters`` style), with a logged loss that sends it to segments."""

    def __init__(self) -> None:
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
        self.opt_G = torch.optim.Adam(self.G.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.opt_D = torch.optim.Adam(self.D.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.history: list[float] = []

    def forward(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        self.opt_D.zero_grad()
        fake = self.G(z)
        loss_d = (nn.functional.binary_cross_entropy_with_logits(self.D(real), ones)
                  + nn.functional.binary_cross_entropy_with_logits(self.D(fake.detach()), zeros))
        loss_d.backward()
        self.opt_D.step()
        self.opt_G.zero_grad()
        loss_g = nn.functional.binary_cross_entropy_with_logits(self.D(fake), ones)
        loss_g.backward()
        self.opt_G.step()
        if loss_g.item() > 100:  # a branch on a loss: segments
            self.history.append(loss_g.item())
        return loss_g.detach()


def test_a_module_whose_forward_trains_compiles_its_submodules_not_itself() -> None:
    """Compiled whole, the GAN's second backward went through the graph a second time and raised,
    where eager runs; its players' forwards are compiled instead."""
    def make() -> nn.Module:
        torch.manual_seed(0)
        return _GANStep()

    eager_model, model = make(), make()
    traced = graphprof.trace(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loss branch's fallback warning
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            real, z = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
            assert torch.equal(eager_model(real, z), traced(real, z)), f"call {i}"
            assert all(map(torch.equal, eager_model.parameters(), model.parameters())), f"call {i}"
    assert traced.capture_mode == "segments"
