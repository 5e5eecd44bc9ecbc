"""A window's relQuery id: written in one place (`WindowId.format`, through
`Window.window_id`), and read back the same by every reader (reset's window starts, the
door, the sinks' query column, usage, the engine's tags)."""

from hypothesis import given
from hypothesis import strategies as st

from relstream.engine.tags import window_query
from relstream.kafka.tools.windowstarts import known_starts
from relstream.model import Template
from relstream.service.doorlimits import is_window_id
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import Window, relquery_for_window
from relstream.wire.windowid import WindowId

windows = st.builds(
    WindowId,
    query=st.text(min_size=1, max_size=40),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    ms=st.integers(-(2**63 - 1), 2**63 - 1),
)


def test_a_windows_relquery_id_names_its_query_and_where_it_starts():
    registration = QueryRegistration("movie-reviews-2", "t", Template("{x}"))
    window = Window(3, 1200, 0.0, [], 1250, -5)  # a row without a timestamp: -5 ms
    relquery_id = relquery_for_window(registration, [], window.window_id(registration.name)).id
    assert relquery_id == "movie-reviews-2-3-1200@-5"
    assert WindowId.parse(relquery_id) == WindowId("movie-reviews-2", 3, 1200, -5)
    assert WindowId.parse("movie-reviews-2") is None  # sent straight to the engine
    assert WindowId.parse("q-0-12") is None  # a window id of a release before `@ms`
    assert WindowId.parse("reviews-0-12@17638x") is None


def test_the_query_is_read_from_a_window_id_of_this_release_or_an_earlier_one():
    assert WindowId.query_of("review-sentiment-3-120@1764000000123") == "review-sentiment"
    assert WindowId.query_of("review-sentiment-3-120") == "review-sentiment"  # earlier
    assert WindowId.query_of("q1") is None  # a relQuery a client submitted itself


@given(windows)
def test_every_reader_reads_back_what_the_writer_wrote(window):
    """Any query name (dashes, digits, `@`, newlines), any partition, offset and
    timestamp: the id the worker writes is read back as the same window by each reader."""
    registration = QueryRegistration("q", "t", Template("{x}"))
    cut = Window(window.partition, window.offset, 0.0, [], window.offset, window.ms)
    written = relquery_for_window(registration, [], cut.window_id(window.query)).id
    assert written == window.format() == str(window)
    assert WindowId.parse(written) == window
    assert WindowId.query_of(written) == window.query
    assert is_window_id(written)  # the door keeps the form for the worker
    assert window_query(written) == window.query  # the engine's fair share and tags
    starts = known_starts([written], window.query)
    assert starts == {window.partition: {window.offset: window.ms}}
