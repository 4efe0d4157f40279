"""The analysis reproduces seed 003 Listings 3.4 and 3.5 from Listing 3.3.

listing33.tsv holds the rows Listing 3.3 prints, with the elided rows (0.4-0.7 s, and
process 1 at 0.8 s) filled so that the totals of Listing 3.4 hold."""

import shutil
from pathlib import Path

import pytest
from dmetabench import analysis
from dmetabench import results as res

HERE = Path(__file__).parent

# Listing 3.4: time, total, rate, stdev, COV (stdev/COV only where Listing 3.3 determines them).
LISTING_34 = [
    (0.1, 27, 0, 0.0, 0.000),
    (0.2, 2290, 22630, 24.8, 0.044),
    (0.3, 4807, 25170, 15.5, 0.025),
    (0.4, 7316, 25090, None, None),
    (0.5, 9866, 25500, None, None),
    (0.6, 12443, 25770, None, None),
    (0.7, 14994, 25510, None, None),
    (0.8, 17568, 25740, None, None),
    (0.9, 19972, 24040, 57.1, 0.095),
    (1.0, 20000, 280, 10.9, 1.561),
]


@pytest.fixture
def resultdir(tmp_path):
    shutil.copy(HERE / "listing33.tsv", tmp_path / "results-StatNocacheFiles-2-4.tsv")
    return tmp_path


def test_reproduces_listing_34(resultdir):
    s = analysis.summarize(res.read(resultdir / "results-StatNocacheFiles-2-4.tsv"), [10000, 25000])
    assert len(s.intervals) == len(LISTING_34)
    for row, (t, total, rate, sd, cov) in zip(s.intervals, LISTING_34, strict=True):
        assert row.timestamp == pytest.approx(t)
        assert row.total == total
        assert round(row.rate) == rate
        if sd is not None:
            assert round(row.stdev, 1) == sd
            assert round(row.cov, 3) == cov


def test_stonewall_wallclock_and_fixed_ops(resultdir):
    s = analysis.summarize(res.read(resultdir / "results-StatNocacheFiles-2-4.tsv"), [10000, 25000])
    assert s.stonewall_time == pytest.approx(0.9)
    assert s.stonewall_ops == 19972
    assert round(s.stonewall_rate) == 22191
    assert round(s.wallclock_rate) == 20000
    assert round(s.fixed[10000]) == 20738
    assert s.fixed[25000] == 0


def test_summary_file_matches_listing_35(resultdir):
    analysis.analyze(resultdir, [10000, 25000])
    assert (resultdir / "summary.tsv").read_text().split() == [
        "StatNocacheFiles",
        "2",
        "2",
        "4",
        "22191",
        "20738",
        "0",
    ]
    rows = (resultdir / "summary-StatNocacheFiles-2-4.tsv").read_text().splitlines()
    assert rows[1].split("\t") == ["StatNocacheFiles", "2", "4", "0.2", "2290", "22630", "24.8", "0.044"]


def test_mdtest_table(resultdir):
    text = analysis.mdtest_table(analysis.analyze(resultdir))
    assert "SUMMARY rate" in text
    assert "File stat (no cache)" in text
    assert "20000.000" in text  # wall-clock: 20,000 operations in 1.0 s


def test_bad_result_files_are_refused(tmp_path):
    bad = tmp_path / "results-X-1-1.tsv"
    bad.write_text("not\ta\tresult\n")
    with pytest.raises(ValueError, match="unexpected header"):
        res.read(bad)
    with pytest.raises(FileNotFoundError):
        analysis.analyze(tmp_path / "empty")
