"""Cutting one input partition into windows: by row count and by the rows' own
timestamps, so a replay cuts the same windows under the same ids."""

import pytest

from relstream.model import Template
from relstream.schemas import RowMessage, encode
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import PartitionWindows

# At most 3 rows, within 2 s of the window's first row.
REGISTRATION = QueryRegistration("q", "t", Template("{x}"), window_seconds=2.0, max_rows=3)


def row(key: str) -> RowMessage:
    return RowMessage(table="t", key=key, values={"x": key})


def cut(records, expire_at=()):
    """Feed (offset, timestamp, key or None) records; expire at the given clock times
    after the records before them. Returns [(window id, keys)] in closing order."""
    cutter = PartitionWindows(REGISTRATION, partition=2)
    closed = []
    for offset, stamp, key in records:
        for now in [t for t in expire_at if t <= stamp]:
            window = cutter.expire(now, lateness=1.0)
            closed += [window] if window else []
        closed += cutter.add(offset, stamp, row(key) if key else None)
    for now in [t for t in expire_at if t > records[-1][1]]:
        window = cutter.expire(now, lateness=1.0)
        closed += [window] if window else []
    return [(w.window_id, [r.key for r in w.rows]) for w in closed], cutter


RECORDS = [
    (10, 0.0, "a"),
    (11, 0.5, "b"),
    (12, 1.0, None),  # a rejected row: no place in a window, its offset is passed
    (13, 1.5, "c"),  # the third row: the window is full
    (14, 10.0, "d"),
    (15, 12.0, "e"),  # at d's deadline (10 + 2): d's window closes, e opens one
]


def test_windows_close_on_the_row_cap_and_on_a_row_past_the_deadline():
    windows, cutter = cut(RECORDS)
    assert windows == [("2-10@0", ["a", "b", "c"]), ("2-14@10000", ["d"])]
    assert cutter.committable() == 15  # e's window is open: a replay starts there


def test_with_no_row_past_the_deadline_the_clock_closes_the_window_late():
    windows, cutter = cut(RECORDS, expire_at=(14.5, 15.0))  # e's deadline 14, +1 s lateness
    assert windows[-1] == ("2-15@12000", ["e"])
    assert cutter.committable() == 16


def test_a_replay_fed_all_at_once_cuts_the_same_windows():
    live, _ = cut(RECORDS, expire_at=(3.0, 12.5, 15.0))
    replayed, _ = cut(RECORDS, expire_at=(15.0,))
    assert live == replayed


def test_a_recreated_topic_names_its_windows_anew():
    # A memory-only broker restarted (or a topic deleted and made again): offsets start
    # over, the records' timestamps do not, so no id of the old incarnation comes back.
    before, _ = cut(RECORDS)
    after, _ = cut([(offset, stamp + 3600.5, key) for offset, stamp, key in RECORDS])
    assert [keys for _, keys in before] == [keys for _, keys in after]
    assert not {i for i, _ in before} & {i for i, _ in after}
    assert [i for i, _ in after] == ["2-10@3600500", "2-14@3610500"]


def registrations(tmp_path, extra: str):
    from relstream.stream.registrations import load_registrations

    path = tmp_path / "queries.toml"
    path.write_text(f'[[query]]\nname = "q"\ntable = "t"\ntemplate = "{{x}}"\n{extra}\n')
    return load_registrations(path)


def test_a_registration_carries_its_output_and_sampling_into_every_window(tmp_path):
    from relstream.stream.windowing import relquery_for_window

    (registration,) = registrations(
        tmp_path, 'choices = ["Yes", "No"]\ntemperature = 0.5\nseed = 3\nstop = ["\\n"]'
    )
    message = relquery_for_window(registration, [row("a")], "0-0")
    assert message.output.choices == ["Yes", "No"]
    assert (message.temperature, message.seed, message.stop) == (0.5, 3, ["\n"])


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ('choices = ["Yes", "Yes"]', "output.choices: choices repeat"),
        ('choices = ["Yes"]\nregex = "Y"', "exactly one of choices, json_schema or regex"),
        ("temperature = 3", "field temperature: expected `float` <= 2.0"),
        ('stop = [""]', "field stop[0]: expected `str` of length >= 1"),
        ('window_seconds = "2"', "field window_seconds: expected `float`, got `str`"),
        ("window_seconds = 0", "field window_seconds: expected `float` > 0.0"),
        ("max_rows = 1.5", "field max_rows: expected `int`, got `float`"),
        ("max_rows = true", "field max_rows: expected `int`, got `bool`"),
        ("max_rows = 100001", "field max_rows: expected `int` <= 100000"),
        ("max_output_tokens = 0", "field max_output_tokens: expected `int` >= 1"),
        ("system_prompt = 3", "field system_prompt: expected `str | null`, got `int`"),
        ("windows_seconds = 2", "field windows_seconds: not a field of this message"),
    ],
)
def test_a_bad_output_or_sampling_field_is_named(tmp_path, extra, reason):
    from relstream.stream.registrations import RegistrationError

    with pytest.raises(RegistrationError) as raised:
        registrations(tmp_path, extra)
    assert reason in str(raised.value)


def test_an_instruction_with_free_fields_reaches_every_window(tmp_path):
    from relstream.stream.registrations import RegistrationError, load_registrations
    from relstream.stream.windowing import check_row, relquery_for_window

    path = tmp_path / "queries.toml"
    path.write_text(
        '[[query]]\nname = "q"\ntable = "t"\ninstruction = "Rate this."\n'
        'fields = ["title", "text"]\n'
    )
    (registration,) = load_registrations(path)
    assert registration.fields == ("title", "text")
    message = relquery_for_window(registration, [row("a")], "0-0")
    assert (message.template, message.fields) == ("Rate this.", ["title", "text"])
    lacking = encode(RowMessage(table="t", key="k", values={"title": "x"}))
    assert "lacks column(s) {text}" in check_row(registration, lacking).reason
    for extra in ('template = "{x}"', ""):  # both, or an instruction without fields
        path.write_text(f'[[query]]\nname = "q"\ntable = "t"\ninstruction = "I"\n{extra}\n')
        with pytest.raises(RegistrationError, match="a template, or an instruction with"):
            load_registrations(path)
