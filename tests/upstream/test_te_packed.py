"""The packed-sequence (THD) rules on ``Facts``: each fires where TE's behaviour says and stays
quiet on its nearest neighbour (the version just past the boundary, the explicit setting, the
comm type that does not run the ring)."""
import dataclasses

import pytest

from hcp_tune.upstream.rules import BY_ID, Facts, evaluate

# Llama 3 8B heads at cp=8, a2a+p2p [2,4], documents packed: TE runs its attention
HCP = Facts(cp=8, tp=1, seq=131072, heads=32, kv_heads=8, comm_types=("a2a+p2p",),
            sizes=(2, 4), packed=True, pad_multiple=16)
P2P = dataclasses.replace(HCP, comm_types=("p2p",), sizes=None)
A2A = dataclasses.replace(HCP, comm_types=("a2a",), sizes=None)
# 12 heads at tp=4: 3 per rank, a2a 3 divides them but 3 is odd
ODD = dataclasses.replace(HCP, cp=6, tp=4, heads=12, kv_heads=12, sizes=(3, 2), pad_multiple=12)


def fired(rule: str, facts: Facts):
    """The finding of ``rule`` on ``facts``, or None."""
    found = evaluate(facts, (BY_ID[rule],))
    return found[0] if found else None


def at(facts: Facts, version: tuple[int, ...] | None, **changes) -> Facts:
    return dataclasses.replace(facts, te_version=version, **changes)


@pytest.mark.parametrize("te,fires", [((2, 17, 1), True), ((2, 18, 0), True), ((2, 19, 0), False),
                                      ((2, 20, 1), False)])
def test_thd_with_a2a_p2p_needs_te_2_19(te, fires):
    f = fired("te-thd", at(HCP, te))
    assert bool(f) == fires
    assert fired("te-thd", at(P2P, (2, 17, 1))) is None  # p2p has no such floor
    assert fired("te-thd", at(HCP, (2, 18, 0), packed=False)) is None


def test_te_thd_says_which_containers_ship_what_and_fixes_by_version():
    f = fired("te-thd", at(HCP, (2, 18, 0)))
    assert f.severity == "error" and "TE #3290" in f.found and "found 2.18.0" in f.found
    assert "NeMo 26.08 and 26.08.01" in f.found and "ship TE 2.18" in f.found
    assert "pins 2.17.1" in f.found
    assert f.fix.startswith("model.cp_comm_type=p2p model.hierarchical_context_parallel_sizes=null")
    assert "transformer-engine[pytorch]>=2.19" in f.fix
    # on 2.17.1 p2p is silently wrong with packing (thd-pad-detect): only the TE floor is offered
    old = fired("te-thd", at(HCP, (2, 17, 1)))
    assert old.fix.startswith("Transformer Engine >= 2.19") and "cp_comm_type" not in old.fix


@pytest.mark.parametrize("facts", [P2P, HCP], ids=["p2p", "a2a+p2p"])
def test_te_2_17_1_refuses_packed_ring_unless_pad_between_seqs(facts):
    f = fired("thd-pad-detect", at(facts, (2, 17, 1)))
    assert f.severity == "error" and "TE #3331" in f.found and "silently wrong" in f.found
    assert "cu_seqlens_padded[:-1]" in f.found and "(before 2.18)" in f.found
    assert f.fix.startswith("Transformer Engine >= 2.18 ")
    assert "PackedSeqParams(pad_between_seqs=True)" in f.fix and "pad_between_seqs=true" in f.fix
    assert fired("thd-pad-detect", at(facts, (2, 17, 1), pad_between_seqs=True)) is None
    assert fired("thd-pad-detect", at(facts, (2, 18, 0))) is None  # identity: exact path


def test_pad_detect_spares_plain_a2a_one_rank_and_cpu_trials():
    assert fired("thd-pad-detect", at(A2A, (2, 17, 1))) is None  # a2a has no ring
    assert fired("thd-pad-detect", at(P2P, (2, 17, 1), cp=1)) is None
    assert fired("thd-pad-detect", at(P2P, (2, 17, 1), te=False)) is None  # torch reference


def test_explicit_pad_between_seqs_false_is_wrong_on_any_te():
    f = fired("thd-pad-detect", at(P2P, (2, 19, 0), pad_between_seqs=False))
    assert f.severity == "error" and "pad_between_seqs=False" in f.found and "TE #3331" in f.found
    assert f.fix.startswith("pad_between_seqs=true")


@pytest.mark.parametrize("te,fires", [((2, 17, 1), False), ((2, 18, 0), True), ((2, 19, 0), True)])
def test_te_2_18_on_notes_the_slower_exact_path(te, fires):
    f = fired("thd-padded-identity", at(P2P, te))
    assert bool(f) == fires
    if f:
        assert f.severity == "info" and "TE #3487" in f.found and "TE #2898" in f.found
        assert "regress" in f.found and f.fix == ""


def test_padded_identity_needs_a_separate_padded_tensor_and_auto_detection():
    assert fired("thd-padded-identity", at(P2P, (2, 18, 0), pad_multiple=1)) is None
    assert fired("thd-padded-identity", at(P2P, (2, 18, 0), pad_between_seqs=True)) is None
    assert fired("thd-padded-identity", at(A2A, (2, 18, 0))) is None


def test_odd_heads_under_a2a_with_padded_packing_leave_no_backend():
    f = fired("thd-no-backend", at(ODD, (2, 19, 0)))
    assert f.severity == "error"
    assert "query heads/tp = 12/4 = 3 and KV heads/tp = 12/4 = 3" in f.found
    assert "no backend is left" in f.found and "FlashAttention 3" in f.found
    assert f.fix == "model.cp_comm_type=p2p model.hierarchical_context_parallel_sizes=null"
    assert fired("thd-no-backend", at(ODD, None)) is not None  # version unknown: still no backend
    # the sbhd rule stands aside for packed layouts: one reason, not two
    assert fired("heads-even-a2a", at(ODD, (2, 19, 0))) is None


@pytest.mark.parametrize("change", [
    {"comm_types": ("p2p",), "sizes": None},  # no a2a: odd heads are fine
    {"tp": 2},  # 6 heads per rank: even
    {"pad_between_seqs": False},  # no padding between documents: FlashAttention 2 stays
    {"te_version": (2, 14, 0)},  # before TE's even-heads filter
    {"packed": False},  # sbhd: heads-even-a2a's case
    {"te": False},  # the torch reference on CPU
])
def test_no_backend_neighbours(change):
    assert fired("thd-no-backend", dataclasses.replace(at(ODD, (2, 19, 0)), **change)) is None


def test_doc_padding_note_gives_the_mix_overhead_when_known():
    f = fired("thd-doc-padding", P2P)
    assert f.severity == "info" and "multiple of 2*cp = 16 tokens" in f.found
    assert "depends on the document lengths" in f.found
    known = fired("thd-doc-padding", dataclasses.replace(P2P, pad_overhead=0.0123))
    assert known.found.endswith("this mix gains 1.23% padding tokens")
    wider = fired("thd-doc-padding", dataclasses.replace(P2P, pad_multiple=64))
    assert "(here 64: pad_seq_to_mult)" in wider.found
    assert fired("thd-doc-padding", dataclasses.replace(P2P, cp=1)) is None


def test_unknown_te_says_what_each_version_does_per_comm_type():
    hcp, p2p = fired("thd-te-unknown", HCP), fired("thd-te-unknown", P2P)
    assert hcp.severity == "info" and "needs TE >= 2.19 (TE #3290" in hcp.found
    assert "TE #3331" in p2p.found and "TE #3487" in p2p.found
    assert hcp.fix == p2p.fix == "validate te_version=X.Y.Z (the container's TE)"
    assert fired("thd-te-unknown", A2A) is None
    assert fired("thd-te-unknown", at(P2P, (2, 19, 0))) is None
    # the general note stands aside for it, and still speaks for a fixed-length a2a+p2p
    assert fired("te-version-unknown", HCP) is None
    assert fired("te-version-unknown", dataclasses.replace(HCP, packed=False)) is not None
