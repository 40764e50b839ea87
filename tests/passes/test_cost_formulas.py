"""Formulas beyond matmul: reductions, pooling, embedding, indexing, copies, and the bytes
conventions (broadcast inputs once, gathers read what they pick, in-place writes count);
and a zoo of common layers and losses, forward and backward, all with formulas."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graphprof.passes.records import CostRecord
from tests.passes.cost_helpers import costs_of, only

F32, I64 = 4, 8


def test_reductions_count_one_operation_per_element_folded() -> None:
    x = torch.randn(4, 5)
    nodes = costs_of(lambda a: (a.sum(1), a.mean(), a.amax(0), torch.logsumexp(a, 1), a.var(1)), x)
    assert only(nodes, "sum").cost.flops == 20 - 4
    assert only(nodes, "mean").cost.flops == 20  # 19 adds and a divide
    assert only(nodes, "amax").cost.flops == 20 - 5
    assert only(nodes, "logsumexp").cost.flops == 4 * 20 + 2 * 4
    assert only(nodes, "var").cost.flops == 4 * 20 + 4
    assert only(nodes, "sum").cost.bytes_written == F32 * 4


def test_pooling_forward_and_backward() -> None:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)

    def f(a):
        out = F.max_pool2d(a, 2) + F.avg_pool2d(a, 2)
        out.sum().backward()
        return out

    nodes = costs_of(f, x)
    out_numel = 2 * 3 * 4 * 4
    assert only(nodes, "max_pool2d_with_indices").cost.flops == out_numel * 4
    assert only(nodes, "avg_pool2d").cost.flops == out_numel * 4
    back = only(nodes, "max_pool2d_with_indices_backward").cost
    assert back.flops == out_numel
    assert back.bytes_written == F32 * x.numel()


def test_embedding_and_gathers_read_only_what_they_pick() -> None:
    weight, idx = torch.randn(1000, 8, requires_grad=True), torch.tensor([3, 1, 4, 1])

    def f(w, i):
        out = F.embedding(i, w)
        out.sum().backward()
        return out, torch.gather(w, 0, i[:, None].expand(4, 8)), w.index_select(0, i)

    nodes = costs_of(f, weight, idx)
    emb = only(nodes, "embedding").cost
    assert (emb.flops, emb.bytes_read, emb.bytes_written) == (0, I64 * 4 + F32 * 4 * 8, F32 * 4 * 8)
    back = only(nodes, "embedding_dense_backward").cost
    assert back.flops == 4 * 8 and back.bytes_written == F32 * 1000 * 8
    # the index is an expanded view: its (4, 1) distinct elements are read once
    assert only(nodes, "gather").cost.bytes_read == I64 * 4 + F32 * 4 * 8
    assert only(nodes, "index_select").cost.bytes_read == I64 * 4 + F32 * 4 * 8


def test_scatters_in_place_write_what_they_touch() -> None:
    x, idx, v = torch.randn(100, 3), torch.tensor([5, 7]), torch.randn(2, 3)

    def f(a, i, b):
        a = a.clone()
        a.index_put_((i,), b, accumulate=True)
        return a, a.scatter_add(0, i[:, None].expand(2, 3), b)

    nodes = costs_of(f, x, idx, v)
    put = only(nodes, "index_put_").cost
    assert put.flops == 6 and put.bytes_written == F32 * 6
    assert put.bytes_read == I64 * 2 + F32 * 6 + F32 * 6  # index, values, the touched elements
    scatter = only(nodes, "scatter_add").cost  # functional: a whole new tensor
    assert scatter.flops == 6 and scatter.bytes_written == F32 * 300


def test_bytes_conventions_broadcast_in_place_casts_views() -> None:
    x, b = torch.randn(8, 16), torch.randn(16)

    def f(a, c):
        y = a + c
        y.mul_(2.0)
        return y.double(), torch.cat([a, a]), y.t(), y.expand(2, 8, 16) * 1.0, torch.zeros_like(a).fill_(1.0)

    nodes = costs_of(f, x, b)
    add = only(nodes, "add").cost
    assert (add.flops, add.bytes_read, add.bytes_written) == (128, F32 * (128 + 16), F32 * 128)
    mul_ = only(nodes, "mul_").cost
    assert (mul_.flops, mul_.bytes_read, mul_.bytes_written) == (128, F32 * 128, F32 * 128)
    cast = only(nodes, "_to_copy").cost
    assert (cast.flops, cast.bytes_read, cast.bytes_written) == (0, F32 * 128, 8 * 128)
    cat = only(nodes, "cat").cost
    assert (cat.flops, cat.bytes_read, cat.bytes_written) == (0, F32 * 128, F32 * 256)  # the same input once
    assert only(nodes, "t").cost == only(nodes, "expand").cost == CostRecord(0, 0, 0)
    mul = only(nodes, "mul").cost  # reads the expanded view's 128 distinct elements, writes 256
    assert (mul.flops, mul.bytes_read, mul.bytes_written) == (256, F32 * 128, F32 * 256)
    fill = only(nodes, "fill_").cost
    assert (fill.flops, fill.bytes_read, fill.bytes_written) == (0, 0, F32 * 128)


def test_a_zoo_of_layers_and_losses_has_formulas_forward_and_backward() -> None:
    torch.manual_seed(0)
    layers = nn.ModuleDict(dict(
        gn=nn.GroupNorm(2, 4), conv=nn.Conv2d(4, 4, 3, padding=1), prelu=nn.PReLU(), up=nn.Upsample(scale_factor=2),
        bilinear=nn.Upsample(scale_factor=2, mode="bilinear"), aavg=nn.AdaptiveAvgPool2d(3), amax=nn.AdaptiveMaxPool2d(2),
        emb=nn.Embedding(10, 4), bag=nn.EmbeddingBag(10, 4, mode="mean"), lstm=nn.LSTM(4, 4, batch_first=True),
        gru=nn.GRU(4, 4, batch_first=True), mha=nn.MultiheadAttention(4, 2, batch_first=True), bn=nn.BatchNorm1d(4),
        rms=nn.RMSNorm(4), deconv=nn.ConvTranspose1d(4, 4, 3),
    ))

    def f(img, idx, tgt):
        h = layers.conv(layers.gn(img))
        h = (F.gelu(h, approximate="tanh") + F.silu(h) + F.mish(h) + F.hardswish(h) + F.leaky_relu(h) + F.elu(h)
             + F.softplus(h) + F.dropout(h, 0.2) + layers.prelu(h) + F.hardtanh(h) + F.hardsigmoid(h))
        pooled = layers.aavg(h).sum() + layers.amax(h).sum() + layers.up(h).sum() + layers.bilinear(h).sum()
        e = layers.emb(idx) + layers.bag(idx.view(2, 3)).unsqueeze(1)
        seq = layers.lstm(e)[0].sum() + layers.gru(e)[0].sum() + layers.mha(e, e, e)[0].sum()
        seq = seq + layers.deconv(e.transpose(1, 2)).sum()
        v = layers.rms(layers.bn(tgt.sin()))
        losses = (F.mse_loss(v, tgt) + F.smooth_l1_loss(v, tgt) + F.huber_loss(v, tgt) + F.l1_loss(v, tgt)
                  + F.binary_cross_entropy(torch.sigmoid(v), (tgt > 0).float())
                  + F.binary_cross_entropy_with_logits(v, (tgt > 0).float(), pos_weight=torch.ones(4))
                  + F.kl_div(F.log_softmax(v, -1), F.softmax(tgt, -1), reduction="batchmean")
                  + F.cross_entropy(v, idx % 4, label_smoothing=0.1) + F.cosine_similarity(v, tgt).sum())
        tensor_ops = (v.norm() + v.std(0).sum() + v.cumsum(0).sum() + torch.topk(v, 2).values.sum()
                      + v.sort(1).values.sum() + v.flip(0).roll(1, 0).sum() + torch.tril(v).sum()
                      + v.scatter(0, (idx % 6)[:, None].expand(6, 4), v).sum() + v.prod() + v.min(1).values.sum()
                      + torch.einsum("ij,kj->ik", v, v).sum() + torch.stack([v, v]).amin())
        loss = pooled + seq + losses + tensor_ops
        loss.backward()
        return loss

    nodes = costs_of(f, torch.randn(2, 4, 8, 8), torch.arange(6), torch.randn(6, 4))
    assert len(nodes) > 500
    assert sorted({c.ann.op for c in nodes if c.cost.flops is None}) == []
    assert {"mkldnn_rnn_layer_backward", "native_group_norm_backward", "_embedding_bag_backward",
            "upsample_bilinear2d_backward", "adaptive_max_pool2d_backward"} <= {c.ann.type for c in nodes}


def test_prims_of_decomposed_segment_graphs_share_the_aten_rules() -> None:
    """Segmented capture's AOTAutograd graphs hold prims (inductor's fma decomposes lerp)."""
    import torch._inductor.inductor_prims  # noqa: F401  registers prims.fma

    prims = torch.ops.prims
    x = torch.randn(4, 5)
    nodes = costs_of(lambda a: (prims.fma(a, a, a), prims.convert_element_type(a, torch.float64),
                                prims.sum(a, [1]), prims.var(a, [1], 1.0), prims.broadcast_in_dim(a, [2, 4, 5], [1, 2])), x)
    assert only(nodes, "fma").cost == CostRecord(2 * 20, F32 * 20, F32 * 20)
    assert only(nodes, "convert_element_type").cost == CostRecord(0, F32 * 20, 8 * 20)
    assert only(nodes, "sum").cost.flops == 20 - 4
    assert only(nodes, "var").cost.flops == 4 * 20 + 4
    assert only(nodes, "broadcast_in_dim").cost == CostRecord(0, 0, 0)
