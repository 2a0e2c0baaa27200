"""Packed sequences (THD) on the job side, in one process: the stream and its CP partition,
the ring's per-document blocks, the reference attention against per-document float64
attention, TE's THD arguments and version gates, and the FLOP count of packed work."""
import dataclasses

import pytest
import torch

from hcp_tune import flops
from hcp_tune.job import bench
from hcp_tune.job.attention import packed, te, verify
from hcp_tune.job.attention.packed import PackedRefAttention, PackedStream, a2a_order
from hcp_tune.job.attention.reference import _blocks
from hcp_tune.job.backend import choose_backend
from hcp_tune.job.failures import EnvironmentProblem
from hcp_tune.spec import TE_MIN_HCP, TrialSpec
from hcp_tune.upstream.te_packed import TE_THD_HCP

DOCS = (100, 5, 37, 64, 1, 3)  # uneven; 5, 1 and 3 are shorter than 2*cp at cp=4


def per_document_attention(q, k, v, stream):
    """float64 causal attention inside each document's real tokens; zeros in padding."""
    out = torch.zeros_like(q)
    for start, length in zip(stream.cu_seqlens(padded=True), stream.docs):
        sl = slice(start, start + length)
        out[:, sl] = verify.full_causal_attention(q[:, sl], k[:, sl], v[:, sl])
    return out


def test_stream_pads_each_document_to_2cp_and_shares_it_per_document():
    s = PackedStream.of([[100, 5, 37], [64, 1, 3]], cp=4)
    assert s.docs == DOCS and s.padded == (104, 8, 40, 64, 8, 8)
    assert s.tokens == 232 and s.real_tokens == 210 and s.pad_between_seqs
    assert s.cu_seqlens(padded=False) == [0, 100, 105, 142, 206, 207, 210]
    assert s.cu_seqlens(padded=True) == [0, 104, 112, 152, 216, 224, 232]
    x = torch.arange(s.tokens).view(1, -1, 1, 1)
    pieces = [packed.packed_share(x, s, r) for r in range(4)]
    assert pieces[0][0, :4, 0, 0].tolist() == [0, 1, 2, 3]  # doc 0's chunk 0 (13 tokens)
    assert pieces[0][0, 13:16, 0, 0].tolist() == [91, 92, 93]  # then its chunk 7
    assert all(p.shape[1] == s.tokens // 4 for p in pieces)
    assert torch.equal(packed.packed_unshare(pieces, s), x)
    assert s.valid.numel() == s.real_tokens and s.valid[100:102].tolist() == [104, 105]
    assert not PackedStream((16, 8), 4).pad_between_seqs  # multiples of 2*cp: no padding


@pytest.mark.parametrize("docs, cp", [((), 2), ((4, 0), 2), ((4,), 0)])
def test_a_stream_without_documents_or_ranks_is_refused(docs, cp):
    with pytest.raises(ValueError, match="packed stream"):
        PackedStream(docs, cp)


@pytest.mark.parametrize("cp, a", [(4, 1), (4, 2), (4, 4), (2, 2), (8, 2)])
def test_ring_blocks_cover_each_documents_causal_pairs_exactly_once(cp, a):
    """Over every ring rank and step, the blocks attend each real query to each real key
    of its own document at or before it, once; nothing across documents or into padding."""
    s = PackedStream(DOCS, cp)
    p = cp // a
    sizes = tuple(a * c for c in s.chunk_sizes(cp))  # chunk sizes after the all-to-all
    starts = s.cu_seqlens(padded=True)
    covered, computed = [], 0
    for me in range(p):
        for owner in range(p):
            for qs, nq, ks, nk, rel in _blocks(s.docs, sizes, me, owner, p):
                computed += nq * nk
                for i in range(nq):
                    for j in range(nk):
                        qpos, kpos = _stream_pos(qs + i, me, sizes, starts, p), \
                            _stream_pos(ks + j, owner, sizes, starts, p)
                        if rel == "full" or kpos <= qpos:
                            covered.append((qpos, kpos))
    want = [(starts[n] + i, starts[n] + j) for n, d in enumerate(s.docs)
            for i in range(d) for j in range(i + 1)]
    assert sorted(covered) == sorted(want)
    # the packed work, not a masked S x S: at most sum(d^2) scores computed
    assert computed <= sum(d * d for d in s.docs) < s.tokens ** 2 / 2


def _stream_pos(local: int, rank: int, sizes, starts, p: int) -> int:
    """Where ring rank ``rank``'s local token ``local`` sits in the padded stream."""
    for size, start in zip(sizes, starts):
        if local < 2 * size:
            chunk = rank if local < size else 2 * p - 1 - rank
            return start + chunk * size + local % size
        local -= 2 * size
    raise AssertionError("past the local tokens")


def test_a2a_order_is_the_per_document_placement_and_its_inverse():
    sizes, a = (3, 1, 2), 2  # two members, each 12 tokens: per document two chunks
    gather, inverse = a2a_order(sizes, a, "cpu")
    assert sorted(gather.tolist()) == list(range(24))
    assert torch.equal(gather[inverse], torch.arange(24))
    # document 0: member 0's first chunk, member 1's first, member 1's second, member 0's
    assert gather[:12].tolist() == [0, 1, 2, 12, 13, 14, 15, 16, 17, 3, 4, 5]


def test_reference_on_one_rank_is_per_document_attention_forward_and_backward():
    s = PackedStream(DOCS, 4)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, s.tokens, 4, 8, generator=g, dtype=torch.float64)
               .requires_grad_() for _ in range(3))
    dout = torch.randn(1, s.tokens, 4, 8, generator=g, dtype=torch.float64)
    out = PackedRefAttention(parts=1)(q, k, v, s)
    out.backward(dout)
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = per_document_attention(q, k, v, s)
    ref.backward(dout)
    # float64: the two sum in different orders (and torch's threads split reductions by the
    # load), so agreement is to about 1e-10, not to the last bit; a wrong mask is ~1e-1
    assert verify.rel_err(out, ref) < 1e-8
    assert all(verify.rel_err(a, b.grad) < 1e-8 for a, b in zip(grads, (q, k, v)))
    pad = torch.ones(s.tokens, dtype=torch.bool)
    pad[s.valid] = False
    assert not out[:, pad].any() and not grads[1][:, pad].any()  # padding: no output, no grad


def test_packed_input_of_the_wrong_length_is_refused_with_the_share_expected():
    s = PackedStream(DOCS, 4)
    x = torch.zeros(1, s.tokens // 4 + 2, 2, 4)
    with pytest.raises(ValueError, match=r"expected \(1, 58\) tokens"):
        PackedRefAttention(parts=4)(x, x, x, s)


def test_proof_stream_has_every_case_a_partition_meets():
    spec = TrialSpec(trial_id="p", a2a=2, p2p=2, seq=256, heads=8, kv_heads=8, head_dim=8,
                     packing="thd", packed_docs=[[256]])
    s = verify.proof_stream(spec)
    unit = 2 * spec.cp
    assert min(s.docs) == 1 and any(1 < d < unit for d in s.docs)
    assert any(d % unit == 0 for d in s.docs) and any(d > unit * 2 for d in s.docs)
    assert any(d % unit not in (0,) and d > unit for d in s.docs)


# ---------------------------------------------------------------- TE's THD arguments


def test_thd_arguments_are_int32_whole_stream_offsets_with_padding_explicit():
    s = PackedStream(DOCS, 4)
    kw = te.thd_forward_kwargs(s, "cpu")
    assert kw["cu_seqlens_q"].dtype == torch.int32 and kw["cu_seqlens_q"].tolist() == \
        s.cu_seqlens(padded=False)
    assert kw["cu_seqlens_kv_padded"].tolist() == s.cu_seqlens(padded=True)
    assert kw["max_seqlen_q"] == kw["max_seqlen_kv"] == 104
    assert kw["pad_between_seqs"] is True
    assert te.thd_record(kw) == {"pad_between_seqs": True,
                                 "cu_seqlens_padded_is_unpadded": False}


def test_thd_arguments_share_the_tensor_when_nothing_is_padded():
    kw = te.thd_forward_kwargs(PackedStream((16, 8, 24), 4), "cpu")
    assert kw["cu_seqlens_q_padded"] is kw["cu_seqlens_q"] and kw["pad_between_seqs"] is False
    assert te.thd_record(kw) == {"pad_between_seqs": False,
                                 "cu_seqlens_padded_is_unpadded": True}


@pytest.mark.parametrize("version, comm, words", [
    ("2.18.0", "a2a+p2p", "older than 2.19.0: packed sequences (THD) with a2a+p2p"),
    ("2.17.1+4329ff8", "a2a+p2p", "TE #3290"),
    ("2.19.0rc1", "a2a+p2p", "older than 2.19.0"),
    ("2.2.1", "p2p", "older than 2.3.0"),
    ("2.19.0", "a2a+p2p", None), ("2.20.0.dev0", "a2a+p2p", None),
    ("2.18.0", "p2p", None), ("2.17.1", "a2a", None), ("2.3.0", "p2p", None),
])
def test_thd_version_gates(version, comm, words):
    got = te.thd_problem(version, comm)
    if words is None:
        assert got is None
    else:
        assert words in got and "\n" not in got


def test_the_job_side_thd_minimum_is_the_rules_one():
    assert tuple(int(x) for x in te.MIN_TE_THD_HCP.split(".")[:2]) == TE_THD_HCP
    assert te.MIN_TE == ".".join(map(str, TE_MIN_HCP))


@pytest.fixture
def te_present(monkeypatch):
    """This machine as if it had a sm90 GPU with TE ``version``: the checks that need
    neither answer from their functions (no package is stood in for)."""
    def with_version(version):
        monkeypatch.setattr(te, "cp_capability_problem", lambda index: None)
        monkeypatch.setattr(te, "te_unavailable_reason", lambda: None)
        monkeypatch.setattr(te, "te_version", lambda: version)
    return with_version


def packed_spec(a2a, p2p, **kw):
    fields = dict(trial_id="t", a2a=a2a, p2p=p2p, seq=256, heads=8, kv_heads=8, head_dim=8,
                  dtype="bf16", packing="thd", packed_docs=[[100, 5]])
    return TrialSpec(**{**fields, **kw})


def test_packed_a2a_p2p_on_te_2_18_is_refused_in_one_line(te_present):
    te_present("2.18.0")
    with pytest.raises(EnvironmentProblem) as e:
        choose_backend(packed_spec(2, 2), 0)
    assert "need TE >= 2.19.0 (TE #3290" in str(e.value) and "\n" not in str(e.value)
    from hcp_tune.job.failures import FailureClass, classify

    assert classify(e.value)[0] == FailureClass.ENVIRONMENT


@pytest.mark.parametrize("version, a2a, p2p", [("2.19.0", 2, 2), ("2.18.0", 1, 4),
                                                ("2.18.0", 4, 1)])
def test_packed_layouts_te_runs_are_given_to_te(te_present, version, a2a, p2p):
    te_present(version)
    assert choose_backend(packed_spec(a2a, p2p), 0).name == "te"
    fixed = dataclasses.replace(packed_spec(2, 2), packing="off", packed_docs=[])
    assert choose_backend(fixed, 0).name == "te"  # fixed length: no THD gate


# ---------------------------------------------------------------- FLOPs


def test_packed_flops_count_sum_of_squares_not_seq_squared():
    fwd, bwd = flops.packed_attention_flops([100, 5, 37], 8, 8)
    assert fwd == 4 * (100**2 + 5**2 + 37**2) * 8 * 8 / 2 and bwd == 2.5 * fwd
    assert flops.causal_attention_flops(256, 8, 8, 2) == flops.packed_attention_flops(
        [256, 256], 8, 8)
    spec = packed_spec(2, 2, packed_docs=[[100, 5, 37], [64]])
    assert bench.flops_per_gpu(spec) == 3.5 * 2 * (100**2 + 25 + 37**2 + 64**2) * 64 / 4
    fixed = dataclasses.replace(spec, packing="off", packed_docs=[])
    assert bench.flops_per_gpu(fixed) == 3.5 * 2 * 256**2 * 64 / 4  # one sequence of seq
    assert "sum(d^2)" in bench.flops_note(spec) and "seq^2" in bench.flops_note(fixed)
