"""Env tags in the file names regress and report write: two tags never share a file."""
from hcp_tune.outputs.regress.args import slug


def test_a_name_is_kept_and_anything_else_is_encoded_without_collisions():
    assert slug("te-2.10") == "te-2.10" and slug("cpu_torch.ref") == "cpu_torch.ref"
    # tags stored before tags had to be names still get a file each
    assert slug("a/b") != slug("a_b") and "/" not in slug("../../x")
    assert len({slug(t) for t in ("a/b", "a_b", "a b", "a%2Fb", "a~b")}) == 5
