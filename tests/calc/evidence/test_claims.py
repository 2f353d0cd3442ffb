"""The source articles' claims (data/claims.yaml): valid, quoted verbatim, and each recorded
verdict equal to what the engine's numbers give now."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from calc.evidence import claims
from calc.evidence.claims import Check, Claim, Claimed, check, judge, load_claims

SEEDS = Path(__file__).resolve().parents[4] / "shared" / "seeds"
ARTICLE_FILES = {"000": "000_692ecf2179cbe2c5.txt", "001": "001_07aadca61132a457.txt"}


def test_claims_file_is_valid_and_covers_both_articles():
    cs = load_claims()
    assert len(cs) >= 60
    assert Counter(c.article for c in cs).keys() == {"000", "001"}
    # the claims the articles' readers ask about most are all there
    ids = {c.id for c in cs}
    for must in ("a1-8xa100-zero3-45gb", "a0-mixed-saves-30-40pct", "a0-flash-30pct-at-2048",
                 "a1-checkpointing-6-7x", "a0-offload-2-5x", "a0-adafactor-2-4p", "a1-adam-12-bytes-156gb",
                 "a1-amp-50pct", "a0-1b-optimizer-16gb", "a1-32k-over-100gb", "a1-70b-fp16-140gb"):
        assert must in ids


@pytest.mark.parametrize("claim", load_claims(), ids=lambda c: c.id)
def test_recorded_verdict_is_the_engines(claim: Claim):
    result = check(claim)
    assert result.verdict == claim.verdict, f"{claim.id}: engine says {result.engine_text}"
    assert claim.reason and "\n" not in claim.reason


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the source articles live outside the repository")
def test_quotes_are_verbatim():
    def squash(s: str) -> str:
        return re.sub(r"\s+", "", s)

    text = {a: squash((SEEDS / f).read_text(encoding="utf-8")) for a, f in ARTICLE_FILES.items()}
    for c in load_claims():
        assert squash(c.quote) in text[c.article], c.id
        heading = squash(c.section)
        assert heading in text[c.article], f"{c.id}: section {c.section!r}"


def test_judge_reads_ranges_and_bounds():
    assert judge(Claimed(low=30, high=40, unit="%"), 35)
    assert not judge(Claimed(low=30, high=40, unit="%"), 67)
    assert judge(Claimed(low=50, unit="%", test="at_least"), 89)
    assert not judge(Claimed(low=1, unit="%", test="at_least"), 0.0)
    assert judge(Claimed(low=True, unit="fits"), True) and not judge(Claimed(low=True, unit="fits"), False)


def test_bad_claims_are_refused():
    with pytest.raises(ValueError, match="per_param needs fields"):
        Check(scenario={"model": "gpt2"}, metric="per_param", fields=["nonsense"])
    with pytest.raises(ValueError, match="compare"):
        Check(scenario={"model": "gpt2"}, metric="peak", form="saving")
    with pytest.raises(ValueError, match="not modelled"):
        Claim(id="x", article="000", section="s", quote="abcd", gist="g", claimed=Claimed(low=1, unit="GB"),
              verdict="holds", reason="r")


def test_a_claim_needs_a_value_or_a_reading():
    with pytest.raises(ValueError, match="claimed value"):
        Claimed(unit="GB")
    assert Claimed(unit="x", shown="O(√L)").text == "O(√L)"


def test_duplicate_ids_are_refused(tmp_path):
    one = Path(claims.CLAIMS_PATH).read_text(encoding="utf-8").split("\n- id:")[1]
    (tmp_path / "c.yaml").write_text("- id:" + one + "\n- id:" + one, encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate claim ids"):
        load_claims(str(tmp_path / "c.yaml"))
