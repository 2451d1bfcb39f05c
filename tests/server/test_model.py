"""The paged, absorbed sparse-MLA model against a straightforward dense per-token implementation
of docs/sparse_mla.md written here; KV/indexer dtypes; safetensors save/load."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels.fused import add_rms_norm_reference
from kernels.quant import (
    decode_e4m3,
    encode_indexer_keys,
    encode_kv_rows,
    fp8_e4m3_quantize,
    read_indexer_keys,
    read_kv_rows,
)
from server.engine.block_table import TABLE_WIDTH_MULTIPLE
from server.engine.kv_cache import BlockManager
from server.engine.messages import SamplingParams
from server.engine.model_runner import MXFP4_NOTE, ModelRunner
from server.engine.scheduler import ScheduledBatch
from server.engine.sequence import Sequence
from server.model.model import save_weights
from tests.server.engine_fixtures import prompt, tiny_config

# Two requests fed in ragged steps: a prefill chunk, a multi-token chunk, then single tokens.
CHUNKS = {"A": (24, 16, 1, 1), "B": (20, 7, 1, 1)}
# 16 indexer heads make exact ties of the ReLU logits (all heads <= 0) practically impossible.
SMALL = dict(index_num_heads=16, index_topk=16)


# ---------------------------------------------------------------- the dense reference


def rope_pairs(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate (x0, x1), (x2, x3), ... of the last dim by pos * theta^(-2i/d)."""
    d = x.shape[-1]
    ang = pos.double()[:, None] * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(1)
    cos, sin = ang.cos(), ang.sin()
    a, b = x.double()[..., 0::2], x.double()[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def rope_halves(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate (x_i, x_{i+d/2}) of the last dim."""
    d = x.shape[-1]
    perm = torch.cat((torch.arange(0, d // 2)[:, None], torch.arange(d // 2, d)[:, None]), 1).flatten()
    inv = torch.argsort(perm)
    return rope_pairs(x[..., perm], pos, theta)[..., inv]


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def dense_attention(attn, h: torch.Tensor, kv_dtype: str, key_dtype: str) -> torch.Tensor:
    """docs/sparse_mla.md steps 1-5 for one request's tokens 0..N-1, non-absorbed, token by token."""
    c = attn.c
    n, H, dn, dr, dc, dv = h.shape[0], c.num_heads, c.qk_nope_dim, c.qk_rope_dim, c.kv_lora_rank, c.v_head_dim
    hi, di, eps, theta = c.index_num_heads, c.index_head_dim, c.rms_norm_eps, c.rope_theta
    pos = torch.arange(n)
    h = h.double()
    W = lambda lin: lin.weight.double()  # noqa: E731
    c_q = rms(h @ W(attn.wq_a).T, attn.q_norm.weight, eps)
    q = (c_q @ W(attn.wq_b).T).view(n, H, dn + dr)
    q_nope, q_pe = q[..., :dn], rope_pairs(q[..., dn:], pos, theta)
    kv = h @ W(attn.wkv_a).T
    lat, k_pe = rms(kv[:, :dc], attn.kv_norm.weight, eps), rope_pairs(kv[:, dc:], pos, theta)
    rows = read_kv_rows(encode_kv_rows(lat.float(), k_pe.float(), kv_dtype), torch.arange(n), dc, dr, kv_dtype).double()
    lat, k_pe = rows[:, :dc], rows[:, dc:]

    ix = attn.indexer
    q_i = (c_q @ W(ix.wq).T).view(n, hi, di)
    q_i = torch.cat((rope_halves(q_i[..., :dr], pos, theta), q_i[..., dr:]), -1)
    k_i = F.layer_norm((h @ W(ix.wk).T), (di,), ix.k_norm.weight.double(), ix.k_norm.bias.double(), ix.k_norm.eps)
    k_i = torch.cat((rope_halves(k_i[..., :dr], pos, theta), k_i[..., dr:]), -1)
    q8, s_q = fp8_e4m3_quantize(q_i.float())
    k_val, s_k = read_indexer_keys(encode_indexer_keys(k_i.float(), key_dtype), di, key_dtype)
    w = (h @ W(ix.weights_proj).T) * s_q.double() / math.sqrt(hi * di)

    w_kv = W(attn.wkv_b).view(H, dn + dv, dc)
    w_uk, w_uv = w_kv[:, :dn], w_kv[:, dn:]
    out = torch.empty(n, H, dv, dtype=torch.float64)
    for t in range(n):
        scores = torch.relu(torch.einsum("hd,sd->hs", decode_e4m3(q8[t]).double(), k_val[: t + 1].double()))
        index_logits = s_k[: t + 1].double() * (w[t][:, None] * scores).sum(0)
        sel = index_logits.topk(min(c.index_topk, t + 1)).indices
        k_nope = torch.einsum("sc,hnc->shn", lat[sel], w_uk)
        v = torch.einsum("sc,hvc->shv", lat[sel], w_uv)
        logits = c.softmax_scale * (torch.einsum("hn,shn->hs", q_nope[t], k_nope) + q_pe[t] @ k_pe[sel].T)
        out[t] = torch.einsum("hs,shv->hv", logits.softmax(-1), v)
    return out.reshape(n, H * dv) @ W(attn.wo).T


def dense_model_logits(model, ids: list[int], kv_dtype: str, key_dtype: str) -> torch.Tensor:
    eps = model.config.rms_norm_eps
    x = model.embed.weight[torch.tensor(ids)].double()
    for layer in model.layers:
        x = x + dense_attention(layer.attn, rms(x, layer.attn_norm.weight, eps).float(), kv_dtype, key_dtype)
        m = rms(x, layer.mlp_norm.weight, eps)
        mlp = layer.mlp
        gate, up = m @ mlp.w_gate.weight.double().T, m @ mlp.w_up.weight.double().T
        x = x + (F.silu(gate) * up) @ mlp.w_down.weight.double().T
    return rms(x, model.norm.weight, eps) @ model.lm_head.weight.double().T


# ---------------------------------------------------------------- driving the real runner


def feed(runner: ModelRunner, token_lists: dict[str, list[int]], chunks: dict[str, tuple[int, ...]]):
    """Teacher-force each request through the runner in the given chunks, batched together.
    Returns per request the logits of every token and, per layer, the attention input/output."""
    blocks = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
    seqs = {rid: Sequence(rid, ids, SamplingParams(max_tokens=1), 0.0) for rid, ids in token_lists.items()}
    captured: list[list[tuple]] = [[] for _ in runner.model.layers]
    layer_inputs: list[list[torch.Tensor]] = [[] for _ in runner.model.layers]
    # The attention reads its input projection, computed with the norm: the layer input it stands
    # for is the norm of the layer's residual stream, as the torch backend computes it.
    hooks = [layer.register_forward_pre_hook(lambda mod, args, i=i: layer_inputs[i].append(
        add_rms_norm_reference(args[0], args[1], mod.attn_norm.weight, mod.attn_norm.eps)[0]))
        for i, layer in enumerate(runner.model.layers)]
    hooks += [layer.attn.register_forward_hook(lambda mod, args, out, i=i: captured[i].append((args[2], out)))
              for i, layer in enumerate(runner.model.layers)]
    logits = {rid: [] for rid in seqs}
    try:
        for step in range(max(len(c) for c in chunks.values())):
            batch = [(seqs[rid], c[step]) for rid, c in chunks.items() if step < len(c)]
            for seq, n in batch:
                blocks.append(seq, n)
            out = runner.execute(ScheduledBatch(tuple(s for s, _ in batch), tuple(n for _, n in batch)),
                                 [n for _, n in batch])
            for (seq, n), part in zip(batch, out.split([n for _, n in batch])):
                logits[seq.request_id].append(part)
                seq.num_computed_tokens += n
    finally:
        for hook in hooks:
            hook.remove()
    order = list(chunks)
    per_layer = []
    for records, hs in zip(captured, layer_inputs):
        by_req = {rid: ([], []) for rid in order}
        for h, (meta, out) in zip(hs, records):
            for rid in order:
                rows = meta.seq_ids == order.index(rid)
                by_req[rid][0].append(h[rows])
                by_req[rid][1].append(out[rows])
        per_layer.append({rid: (torch.cat(a), torch.cat(b)) for rid, (a, b) in by_req.items()})
    return {rid: torch.cat(v) for rid, v in logits.items()}, per_layer


def token_lists():
    return {rid: list(prompt(i + 7, sum(c))) for i, (rid, c) in enumerate(CHUNKS.items())}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("kv_cache_dtype, key_dtype", [("bf16", "fp8"), ("fp8", "mxfp4")])
def test_attention_layers_match_dense_reference(kv_cache_dtype, key_dtype):
    """Each layer's sparse attention, fed the layer input the model saw, equals the dense
    per-token computation, with top-k (16) smaller than most contexts (up to 42)."""
    runner = ModelRunner(tiny_config(kv_cache_dtype=kv_cache_dtype, indexer_key_dtype=key_dtype, num_blocks=16,
                                     **SMALL))
    _, per_layer = feed(runner, token_lists(), CHUNKS)
    kv_dtype = runner.settings.kv_dtype
    for layer, captured in zip(runner.model.layers, per_layer):
        for rid, (h, out) in captured.items():
            ref = dense_attention(layer.attn, h, kv_dtype, key_dtype)
            assert rel_err(out, ref) < 1e-2, (rid, rel_err(out, ref))


def test_mxfp4_keys_say_what_an_ab_against_fp8_measures(caplog):
    with caplog.at_level(logging.WARNING, logger="server.engine.model_runner"):
        ModelRunner(tiny_config(indexer_key_dtype="mxfp4", num_blocks=16))
        ModelRunner(tiny_config(num_blocks=16))
    assert [r.getMessage() for r in caplog.records] == [MXFP4_NOTE]


def test_model_logits_match_dense_reference():
    """Whole model (embedding, norms, MLP, head) with every context within top-k."""
    runner = ModelRunner(tiny_config(num_blocks=16, index_topk=64))
    lists = token_lists()
    logits, _ = feed(runner, lists, CHUNKS)
    for rid, ids in lists.items():
        ref = dense_model_logits(runner.model, ids, "bf16", "fp8")
        assert rel_err(logits[rid], ref) < 1e-2
        assert torch.equal(logits[rid].argmax(-1), ref.argmax(-1))


def test_kv_and_indexer_dtypes_give_close_logits():
    lists = token_lists()
    results = {}
    for kv in ("bf16", "fp8"):
        for key in ("fp8", "mxfp4"):
            runner = ModelRunner(tiny_config(kv_cache_dtype=kv, indexer_key_dtype=key, num_blocks=16, **SMALL))
            results[kv, key] = torch.cat(list(feed(runner, lists, CHUNKS)[0].values()))
    base = results["bf16", "fp8"]
    for combo, logits in results.items():
        cos = F.cosine_similarity(logits, base, dim=-1)
        assert torch.isfinite(logits).all()
        assert cos.min() > 0.9 and cos.mean() > 0.97, (combo, cos.min(), cos.mean())


def test_save_load_roundtrip(tmp_path):
    path = str(tmp_path / "tiny.safetensors")
    source = ModelRunner(tiny_config(seed=0, num_blocks=16))
    save_weights(source.model, path)
    other = ModelRunner(tiny_config(seed=1, num_blocks=16))
    loaded = ModelRunner(tiny_config(seed=1, num_blocks=16, weights=path))
    lists = token_lists()
    a = feed(source, lists, CHUNKS)[0]
    b = feed(loaded, lists, CHUNKS)[0]
    c = feed(other, lists, CHUNKS)[0]
    assert all(torch.equal(a[r], b[r]) for r in a)
    assert not torch.allclose(a["A"], c["A"])


def test_load_rejects_mismatched_weights(tmp_path):
    path = str(tmp_path / "three_layers.safetensors")
    save_weights(ModelRunner(tiny_config(num_layers=3, num_blocks=4)).model, path)
    with pytest.raises(ValueError, match="--weights .*tensor names do not match"):
        ModelRunner(tiny_config(num_blocks=4, weights=path))
    wide = str(tmp_path / "wide.safetensors")
    save_weights(ModelRunner(tiny_config(intermediate_size=512, num_blocks=4)).model, wide)
    with pytest.raises(ValueError, match="w_gate.weight has shape"):
        ModelRunner(tiny_config(num_blocks=4, weights=wide))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read safetensors"):
        ModelRunner(tiny_config(num_blocks=4, weights=str(junk)))


def test_runner_refuses_a_slot_outside_the_cache():
    # The cache writers skip their range check on GPU tensors (a host sync per layer); the runner
    # checks each step's slots once on the host, so a bad block id never reaches a kernel.
    runner = ModelRunner(tiny_config(num_blocks=4))
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=1), 0.0)
    seq.block_ids = [runner.num_blocks]  # one past the last block
    with pytest.raises(ValueError, match="step slots: slots out of range"):
        runner.execute(ScheduledBatch((seq,), (3,)), [1])


def test_default_capture_sizes_reach_max_num_seqs():
    from server.engine.cuda_graph import default_capture_sizes

    assert default_capture_sizes(1) == (1,)
    assert default_capture_sizes(3) == (1, 2, 4)
    assert default_capture_sizes(16) == (1, 2, 4, 8, 16)
    assert default_capture_sizes(20) == (1, 2, 4, 8, 16, 24)


def test_block_table_grows_with_the_batch_without_doubling_and_lets_finished_requests_go():
    """A batch growing one request a step widens the kept table only as its rows gain blocks, and a
    request that left the batch is not kept alive by the row it held."""
    import gc
    import weakref

    from server.engine.block_table import BlockTable

    bt = BlockTable()
    blocks = BlockManager(256, 4, enable_prefix_caching=False)
    seqs = []
    for i in range(40):
        seqs.append(Sequence(f"r{i}", list(range(8)), SamplingParams(max_tokens=4), 0.0))
        blocks.append(seqs[-1], 8)
        assert bt.build(tuple(seqs)).shape == (i + 1, TABLE_WIDTH_MULTIPLE)  # 2 blocks, padded
    assert bt._table.shape[1] <= 2 * TABLE_WIDTH_MULTIPLE
    gone = weakref.ref(seqs.pop())
    bt.build(tuple(seqs))
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("batch, size, q", [(1, 4, 1), (3, 8, 4), (0, 2, 1)])
def test_graph_padding_rows_alike_in_numpy_and_torch(batch, size, q):
    """A graph's padding requests are written by torch into the device buffer at capture and by
    numpy into the pinned staging buffers at replay: both give token 0 at positions 0..q-1 of the
    request's own table row, whose first block is the dummy, and leave the real requests alone."""
    from server.engine.cuda_graph import PAD_TOKEN, inputs_bytes, pad_requests, staged_inputs

    dummy, block_size, blocks, pending_len = 9, 16, 3, 5
    layout = pending_len, size * q, size, blocks
    buffers = [torch.full((inputs_bytes(*layout),), 0x7F, dtype=torch.uint8) for _ in range(2)]
    torch_views, numpy_views = (staged_inputs(b, *layout).views for b in buffers)
    pad_requests(torch_views, batch, size, q, dummy, block_size, pending_len)
    pad_requests(numpy_views.numpy(), batch, size, q, dummy, block_size, pending_len)
    assert torch.equal(buffers[0], buffers[1])
    t = torch_views
    rows = range(batch * q, size * q)
    padded = [[t.ids[i], t.source[i], t.positions[i], t.context_lens[i], t.seq_ids[i], t.slots[i]] for i in rows]
    assert [[int(v) for v in row] for row in padded] == [
        [PAD_TOKEN, pending_len + i, i % q, i % q + 1, i // q, dummy * block_size + i % q] for i in rows]
    untouched = 0x7F7F7F7F7F7F7F7F
    assert all(int(v) == untouched for v in t.ids[:batch * q]) and all(int(v) == untouched for v in t.slots[:batch * q])
    assert (t.table[batch:, 0] == dummy).all() and (t.table[:batch] == 0x7F7F7F7F).all()
    assert (t.table[:, 1:] == 0x7F7F7F7F).all()


def test_a_graphs_inputs_are_one_span_after_the_pending_tokens():
    """After the pending tokens come the token ids (so [pending, ids] is one int64 array to gather
    from), then the rest of a step's inputs, the block table last: one copy of [start, end) moves
    them; the views share the buffer's memory."""
    from server.engine.cuda_graph import inputs_bytes, staged_inputs

    buffer = torch.zeros(1000, dtype=torch.uint8)
    staged = staged_inputs(buffer, pending_len=4, rows=6, requests=3, blocks=5)
    v = staged.views
    assert staged.start == 4 * 8
    assert staged.end == inputs_bytes(4, 6, 3, 5) == 4 * 8 + 8 + 6 * (4 * 8 + 2 * 4) + 3 * 5 * 4
    assert [x.dtype for x in (v.ids, v.host_row, v.source, v.positions, v.slots)] == [torch.int64] * 5
    assert [x.dtype for x in (v.seq_ids, v.context_lens, v.table)] == [torch.int32] * 3
    assert v.table.shape == (3, 5) and v.table.is_contiguous() and v.host_row.shape == (1,)
    v.ids[0] = -3
    v.table[2, 4] = 7
    assert buffer[:(4 + 6) * 8].view(torch.int64)[4].item() == -3
    assert buffer[staged.end - 4:staged.end].view(torch.int32).item() == 7
    assert (buffer[staged.end:] == 0).all()


def test_context_buckets_split_at_the_topk_single_launch_width():
    """Decode graphs are captured for logits as wide as the top-k's one-launch kernel takes, and
    for max_model_len; a model no longer than that width has one bucket."""
    from kernels.topk import SINGLE_PASS_MAX_COLS
    from server.engine.cuda_graph import context_buckets

    assert context_buckets(8 * SINGLE_PASS_MAX_COLS) == (SINGLE_PASS_MAX_COLS, 8 * SINGLE_PASS_MAX_COLS)
    assert context_buckets(SINGLE_PASS_MAX_COLS) == (SINGLE_PASS_MAX_COLS,)
    assert context_buckets(100) == (100,)


def test_cpu_runner_runs_eagerly_without_graphs():
    """On CPU no graph is captured and no dummy block is allocated: the eager path is the one tested here."""
    from server.engine.model_runner import ModelRunner
    from tests.server.engine_fixtures import tiny_config

    runner = ModelRunner(tiny_config(num_blocks=8))
    assert runner.graphs is None
    assert runner.cache.kv[0].shape[0] == 8 * runner.block_size


def padded_width(seqs) -> int:
    """The block table's width: the longest block list rounded up to TABLE_WIDTH_MULTIPLE."""
    return -(-max(len(s.block_ids) for s in seqs) // TABLE_WIDTH_MULTIPLE) * TABLE_WIDTH_MULTIPLE


def test_block_table_rows_follow_appends_releases_and_frees():
    """The runner keeps each request's block-table row between steps; after blocks are released
    (rejected drafts) or freed (preemption) and others appended, the table is the block list again."""
    runner = ModelRunner(tiny_config(num_blocks=32))
    blocks = BlockManager(32, runner.block_size, enable_prefix_caching=False)
    a = Sequence("a", list(range(40)), SamplingParams(max_tokens=4), 0.0)
    b = Sequence("b", list(range(20)), SamplingParams(max_tokens=4), 0.0)

    def table() -> list[list[int]]:
        seqs = (a, b)
        width = padded_width(seqs)
        expected = [s.block_ids + [0] * (width - len(s.block_ids)) for s in seqs]
        got = runner.block_table.build(seqs).tolist()
        assert got == expected
        return got

    blocks.append(a, 40)
    blocks.append(b, 20)
    table()
    blocks.append(a, 60)  # grows: the kept row is extended
    table()
    a.num_computed_tokens = 33  # rejected drafts past 33 tokens: the tail blocks go back
    blocks.release_tail(a)
    blocks.append(b, 40)  # b may now get the released blocks
    blocks.append(a, 30)  # and a new ones, the row's length as before
    table()
    blocks.free(a)  # preemption
    blocks.append(a, 50)
    table()


def test_block_table_rewrites_rows_whose_request_moved_and_zero_pads():
    """Rows are kept between steps; when the batch's requests leave, reorder or change length, each
    row is again its request's block list padded with zeros (no ids left from a row's last holder),
    and a table returned earlier is not changed by later builds."""
    from server.engine.block_table import BlockTable

    bt = BlockTable()
    blocks = BlockManager(64, 4, enable_prefix_caching=False)
    a, b, c = (Sequence(r, list(range(n)), SamplingParams(max_tokens=4), 0.0)
               for r, n in (("a", 40), ("b", 8), ("c", 20)))
    for s in (a, b, c):
        blocks.append(s, len(s))

    def check(*seqs: Sequence) -> np.ndarray:
        width = padded_width(seqs)
        got = bt.build(seqs)
        assert got.tolist() == [s.block_ids + [0] * (width - len(s.block_ids)) for s in seqs]
        return got

    first = check(a, b, c)
    kept = first.copy()
    check(b, c)  # a left: every row now holds another request
    check(c, a, b)
    blocks.free(a)
    blocks.append(a, 4)  # a shrank to one block in a row that held ten
    check(b, a, c)
    blocks.append(b, 30)  # b grows past the table's width
    check(b, a, c)
    assert (first == kept).all()


def test_fused_linears_are_views_of_one_weight_after_a_dtype_move():
    """The linears reading one input share one stacked weight (one GEMM); after `.to(dtype)` each
    linear's weight is again a view of it, so editing a linear edits what the GEMM reads."""
    from server.model.layers import FusedLinears, OwnsFusedLinears

    class Pair(OwnsFusedLinears):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 3, bias=False), torch.nn.Linear(8, 5, bias=False)
            self.both = FusedLinears(self.a, self.b)

    pair = Pair().to(torch.float64)
    x = torch.randn(4, 8, dtype=torch.float64)
    assert pair.both.weight.dtype == torch.float64 and pair.both.sizes == [3, 5]
    torch.testing.assert_close(F.linear(x, pair.both.weight), torch.cat((pair.a(x), pair.b(x)), dim=-1))
    with torch.no_grad():
        pair.b.weight.mul_(2.0)
    torch.testing.assert_close(F.linear(x, pair.both.weight)[:, 3:], pair.b(x))
    assert pair.a.weight.data_ptr() == pair.both.weight.data_ptr()
    assert list(pair.state_dict()) == ["a.weight", "b.weight"]  # checkpoints keep the linears' names
