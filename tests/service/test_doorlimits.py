"""The HTTP door's bounds as pure bookkeeping, on hand-computed cases: what a request
holds, what it gives back, which ids it may take."""

import pytest

from relstream.service.doorlimits import DoorAdmission, DoorLimits, HttpError, is_window_id


def refusal(action) -> tuple[int, int | None]:
    with pytest.raises(HttpError) as refused:
        action()
    return refused.value.status, refused.value.retry_after


def test_places_rows_and_bytes_are_held_until_given_back_once():
    door = DoorAdmission(DoorLimits(relqueries=2, rows=10, body_bytes=100))
    first, second = door.enter(), door.enter()
    assert refusal(door.enter) == (429, 1)
    first.hold_bytes(40)  # as it declares
    first.hold_bytes(30)  # what arrived so far: it holds what it declared already
    first.hold_rows(6)
    assert refusal(lambda: second.hold_rows(5)) == (429, 1)  # 6 + 5 > 10
    assert refusal(lambda: second.hold_bytes(61)) == (429, 1)  # 40 + 61 > 100
    assert refusal(lambda: second.hold_rows(11)) == (413, None)  # never fits
    assert refusal(lambda: second.hold_bytes(101)) == (413, None)
    second.hold_bytes(60)
    assert (door.relqueries, door.rows, door.body_bytes) == (2, 6, 100)
    first.release()
    first.release()  # once only
    assert (door.relqueries, door.rows, door.body_bytes) == (1, 0, 60)
    second.release()
    assert (door.relqueries, door.rows, door.body_bytes) == (0, 0, 0)


def test_an_id_is_held_by_one_request_and_freed_with_it():
    door = DoorAdmission(DoorLimits())
    first, second = door.enter(), door.enter()
    first.claim("q1")
    assert refusal(lambda: second.claim("q1")) == (409, None)
    first.release()
    second.claim("q1")
    assert "q1" in door


@pytest.mark.parametrize(
    ("relquery_id", "workers"),
    [
        ("reviews-0-12@1763800000000", True),
        ("my-query-name-3-0@-1", True),  # a row without a timestamp
        ("reviews-0-12", False),  # an earlier release's window id: a plain string
        ("fill-42", False),
        ("a-b-1@2", False),
        ("reviews-0-12@17638x", False),
    ],
)
def test_the_workers_window_ids_are_told_from_others(relquery_id, workers):
    assert is_window_id(relquery_id) == workers
