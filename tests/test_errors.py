"""Which process of a launch prints a user error."""

from medrecipes.errors import first_to_report


def test_the_first_rank_of_a_launch_reports_and_the_others_do_not(tmp_path, monkeypatch):
    attempt = tmp_path / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / "1" / "error.json"))
    assert first_to_report()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / "0" / "error.json"))
    assert not first_to_report()


def test_a_process_outside_a_launcher_or_without_its_folder_reports(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert first_to_report()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "gone" / "0" / "error.json"))
    assert first_to_report() and first_to_report()
