"""The length mix (hcp_tune/packing.py): files, presets, packing and the CP partition."""
import pytest

from hcp_tune import packing
from hcp_tune.packing import MixError, load_mix, pack, padded, rank_ranges, summarise


def test_csv_and_plain_files_read_as_the_same_histogram(tmp_path):
    (tmp_path / "a.csv").write_text("length,count\n100,2\n300,1\n")
    (tmp_path / "b.txt").write_text("300\n100\n# a comment\n100\n")
    a, b = load_mix("a.csv", 1024, tmp_path), load_mix(str(tmp_path / "b.txt"), 1024)
    assert a.counts == b.counts == ((100, 2), (300, 1))
    assert a.digest == b.digest and a.label == f"a.csv#{a.digest}"


@pytest.mark.parametrize("text, words", [
    ("", "no document lengths"),
    ("100\n-5\n", "line 2 '-5'"),
    ("100\nabc\n", "line 2 'abc'"),
    ("0\n", "a length must be >= 1"),
    ("100,2,3\n", "line 1 '100,2,3'"),
    ("4096\n9000\n", "a document of 9000 tokens is longer than seq=8192"),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, text, words):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(MixError) as e:
        load_mix("m.csv", 8192, tmp_path)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_presets_are_cut_to_seq_and_an_unknown_one_is_named():
    mix = load_mix("books", 8192)
    assert mix.longest == 8192 and mix.documents == packing.PRESET_POINTS
    assert load_mix("lognormal:1000:0", 8192).counts == ((1000, packing.PRESET_POINTS),)
    for bad in ("nope", "lognormal:1000", "lognormal:-3:1", "missing/file.csv"):
        with pytest.raises(MixError, match="data.lengths"):
            load_mix(bad, 8192)


def test_packing_fills_sequences_with_padded_documents_and_is_repeatable():
    mix = load_mix("web", 8192)
    seqs = pack(mix, 8192, 4, sequences=5)
    assert seqs == pack(mix, 8192, 4, sequences=5) and len(seqs) == 5
    for s in seqs:
        assert s and sum(padded(d, 4) for d in s) <= 8192
    s = summarise(mix, 8192, 4)
    assert s.docs_per_seq > 1 and 0 < s.attention_fraction < 1 and 0 < s.fill <= 1


def test_each_rank_holds_chunks_r_and_2cp_minus_1_minus_r_of_every_document():
    docs, cp = [10, 30], 2  # padded to 12 and 32: chunks of 3 and 8
    assert rank_ranges(docs, cp, 0) == [(0, 3), (9, 12), (12, 20), (36, 44)]
    held = sorted(r for rank in range(cp) for r in rank_ranges(docs, cp, rank))
    assert sum(e - s for s, e in held) == 44  # the whole padded stream, once


def test_a_trial_times_the_draws_nearest_the_mixs_median_work():
    mix = load_mix("web", 8192)
    pool = pack(mix, 8192, 4, 32)
    work = sorted(sum(d * d for d in s) for s in pool)
    chosen = packing.typical(mix, 8192, 4, sequences=1)
    assert len(chosen) == 1 and chosen[0] in pool
    got = sum(d * d for d in chosen[0])
    assert work[12] <= got <= work[19]  # within the middle of the pool's work
    assert packing.typical(mix, 8192, 4, sequences=3) == packing.typical(mix, 8192, 4, 3)
