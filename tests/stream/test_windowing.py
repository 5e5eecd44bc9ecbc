"""Cutting one input partition into windows: by row count and by the rows' own
timestamps, so a replay cuts the same windows under the same ids."""

import pytest

from relstream.model import Template
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import PartitionWindows
from relstream.wire import RowMessage, encode

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
    return [(str(w.window_id("q")), [r.key for r in w.rows]) for w in closed], cutter


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
    assert windows == [("q-2-10@0", ["a", "b", "c"]), ("q-2-14@10000", ["d"])]
    assert cutter.committable() == 15  # e's window is open: a replay starts there


def test_with_no_row_past_the_deadline_the_clock_closes_the_window_late():
    windows, cutter = cut(RECORDS, expire_at=(14.5, 15.0))  # e's deadline 14, +1 s lateness
    assert windows[-1] == ("q-2-15@12000", ["e"])
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
    assert [i for i, _ in after] == ["q-2-10@3600500", "q-2-14@3610500"]


# Windows cut by bytes: up to 10 rows, so only the byte budget closes them here.
BY_BYTES = QueryRegistration("q", "t", Template("{x}"), window_seconds=2.0, max_rows=10)
# Its relQuery with no rows and the longest window id, in msgpack: map16 header 3;
# version 8+1; id 3 + 2+53 ("q-2147483647-9223372036854775807@-9223372036854775807");
# template 9+4; rows 5 + its array header, kept at its largest, 5; max_output_tokens 18+1;
# submitted_at 13+9; priority 9+2 (-100, the class that encodes longest: a window may go
# a class below its registration's). Temperature and top_p, at their defaults (`Sampling`'s,
# which the wire's are), are left out.
BY_BYTES_FIXED = 3 + 9 + 58 + 13 + 5 + 5 + 19 + 22 + 11  # 145
ABC_ROW_BYTES = 1 + 4 + 2 + 7 + 1 + 2 + 4  # {"key": "a", "values": {"x": "abc"}}: 21


def test_a_row_takes_its_key_and_values_encoded_in_a_relquery():
    from relstream.stream.windowing import row_bytes
    from relstream.wire import RelQueryRow

    abc = RowMessage(table="t", key="a", values={"x": "abc"}, produced_at=1.5)
    assert row_bytes(abc) == ABC_ROW_BYTES == 21  # the table and produced_at stay out
    assert row_bytes(abc) == len(encode(RelQueryRow(key="a", values={"x": "abc"})))


def test_the_rows_budget_is_the_message_limit_less_the_envelope_and_the_other_fields():
    from relstream.kafka.clients.aio import MAX_REQUEST_BYTES
    from relstream.stream.windowing import ENVELOPE_BYTES, MESSAGE_BYTES, rows_budget

    assert rows_budget(BY_BYTES, 10_000) == 10_000 - ENVELOPE_BYTES - BY_BYTES_FIXED == 5_759
    assert MESSAGE_BYTES == MAX_REQUEST_BYTES  # the bound where the broker tells none


def test_a_window_closes_before_the_row_that_would_take_it_over_the_byte_budget():
    from relstream.stream.windowing import ENVELOPE_BYTES, RowRejection, relquery_for_window

    limit = ENVELOPE_BYTES + BY_BYTES_FIXED + 50  # room for 50 bytes of rows: two of 21
    rows = [RowMessage(table="t", key=key, values={"x": "abc"}) for key in "abcde"]

    def feed():
        cutter = PartitionWindows(BY_BYTES, partition=0, message_bytes=limit)
        closed = []
        for offset, one in enumerate(rows):
            checked = cutter.check(encode(one))
            closed += cutter.add(offset, offset * 0.1, *checked)
        return cutter, closed

    cutter, closed = feed()
    assert cutter.budget == 50
    assert [([r.key for r in w.rows], w.rows_bytes, list(w.offsets)) for w in closed] == [
        (["a", "b"], 42, [0, 1]),
        (["c", "d"], 42, [2, 3]),
    ]
    assert (cutter.open.rows_bytes, cutter.committable()) == (21, 4)  # e's window, open
    _, replayed = feed()
    ids = [str(w.window_id("q")) for w in closed]
    assert [str(w.window_id("q")) for w in replayed] == ids == ["q-0-0@0", "q-0-2@200"]
    for window in closed:  # the relQuery with its envelope fits, with the id's room to spare
        message = relquery_for_window(BY_BYTES, window.rows, window.window_id("q"))
        assert len(encode(message)) + ENVELOPE_BYTES <= limit
    # A row that alone takes more: 1 + 4 + 4 ("big") + 7 + 1 + 2 + (2 + 40) = 61 bytes.
    alone = RowMessage(table="t", key="big", values={"x": "y" * 40})
    refused = cutter.check(encode(alone))
    assert isinstance(refused, RowRejection)
    assert refused.reason.startswith("row 'big' takes 61 bytes in a relQuery")
    assert f"room for 50 bytes of rows (the broker's message limit, {limit} bytes" in refused.reason


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
        ("windows_seconds = 2", "unknown key 'windows_seconds' (did you mean 'window_seconds'?)"),
    ],
)
def test_a_bad_output_or_sampling_field_is_named(tmp_path, extra, reason):
    from relstream.stream.registrations import RegistrationError

    with pytest.raises(RegistrationError) as raised:
        registrations(tmp_path, extra)
    assert reason in str(raised.value)


def test_every_unknown_key_is_named_with_the_nearest_valid_one(tmp_path):
    from relstream.stream.registrations import RegistrationError, load_registrations

    path = tmp_path / "queries.toml"
    path.write_text(
        '[[query]]\nname = "a"\ntable = "t"\ntemplate = "{x}"\nmax_row = 5\ntemprature = 0.1\n'
        '[[query]]\nname = "b"\ntable = "t"\ntemplate = "{x}"\nresult_fromat = "json"\n'
        "[querry]\nzzz = 1\n"
    )
    with pytest.raises(RegistrationError) as raised:
        load_registrations(path)
    assert str(raised.value).split("; ") == [
        f"{path}: unknown key 'querry' (did you mean 'query'?)",
        f"{path} [[query]] #1: unknown key 'max_row' (did you mean 'max_rows'?)",
        f"{path} [[query]] #1: unknown key 'temprature' (did you mean 'temperature'?)",
        f"{path} [[query]] #2: unknown key 'result_fromat' (did you mean 'result_format'?)",
    ]


def test_a_window_of_old_rows_goes_a_class_below_its_registrations(tmp_path):
    from relstream.stream.windowing import relquery_for_window, window_priority

    (live,) = registrations(tmp_path, "priority = 2\nbackfill_after_s = 60.0")
    now = 10_000.0
    assert window_priority(live, first_ms=int((now - 59) * 1000), now=now) == 2
    assert window_priority(live, first_ms=int((now - 61) * 1000), now=now) == 1  # a reset's
    (plain,) = registrations(tmp_path, "")
    assert window_priority(plain, first_ms=0, now=now) == 0  # no backfill_after_s: never
    assert relquery_for_window(live, [row("a")], "0-0", 1).priority == 1
    assert relquery_for_window(live, [row("a")], "0-0").priority == 2
    with pytest.raises(Exception, match="field priority: expected `int` <= 100"):
        registrations(tmp_path, "priority = 101")


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
    typo = encode(RowMessage(table="t", key="k", values={"title": "x", "txet": "y"}))
    assert check_row(registration, typo).reason == (
        "row 'k' lacks column(s) {text} that query 'q' uses (it has title, txet; did you "
        "mean {txet} for {text}?)"
    )
    for extra in ('template = "{x}"', ""):  # both, or an instruction without fields
        path.write_text(f'[[query]]\nname = "q"\ntable = "t"\ninstruction = "I"\n{extra}\n')
        with pytest.raises(RegistrationError, match="a template, or an instruction with"):
            load_registrations(path)
