"""Consumer groups as `relstream status` shows them, read from the broker alone: each
group's lag by topic, in records a `read_committed` reader would find (what
`kafka-consumer-groups --describe` gives, less the transaction markers), what the group
is (worker, engines, a results reader) and its members.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from relstream.kafka.clients.bounds import count_records
from relstream.kafka.clients.topics import Topics

COUNTED = 10_000  # a group's gap read and its records counted, at most (offsets beyond)


@dataclass(frozen=True)
class GroupLag:
    group: str
    stage: str  # what the group is, from the topics it reads: worker, engines, readers
    lag: dict[str, int]  # topic -> records after the committed offsets a reader can read
    members: int | None  # None where the broker would not say


def stage_of(topics: Topics, read: set[str]) -> str:
    """What a consumer group is, from the topics it has committed offsets on."""
    if any(name.startswith(topics.rows("")) for name in read):
        return "worker"
    if topics.relqueries in read:
        return "engines"
    if read & {topics.results, topics.partial_results}:
        return "results reader"
    return "reader"


def group_names(admin) -> list[str]:
    return sorted(entry["group_id"] for entry in admin.list_groups())


def group_lag(
    admin, consumer, group: str, topics: Topics, found: dict, deadline: float
) -> GroupLag:
    """The group's lag on the pipeline's topics (those it has no offsets on left out): the
    records a `read_committed` reader finds after its committed offsets, up to where an
    open transaction holds a partition. A gap of at most COUNTED offsets is read and its
    records counted (transaction markers take offsets too: an idle exactly-once pipeline
    lags 0); a longer one, or one not read in time, counts its offsets."""
    committed = admin.list_group_offsets(group).get(group, {})
    lag: Counter[str] = Counter()
    counted: dict[object, tuple[int, int]] = {}
    for partition, offset in committed.items():
        if partition in found and offset.offset >= 0:
            extent = found[partition]
            # A commit before the log start (retention took the rest) lags from the start.
            first = max(offset.offset, extent.start)
            lag[partition.topic] += max(0, extent.stable - first)
            if 0 < extent.stable - first <= COUNTED:
                counted[partition] = (first, extent.stable)
    for partition, records in count_records(consumer, counted, deadline).items():
        first, end = counted[partition]  # read: its records, not its offsets
        lag[partition.topic] += records - (end - first)
    return GroupLag(group, stage_of(topics, set(lag)), dict(lag), None)


def member_counts(admin, groups: list[str]) -> dict[str, int]:
    """Members of each group the broker describes; {} where it does not."""
    return {group: len(found) for group, found in group_members(admin, groups).items()}


def group_members(admin, groups: list[str]) -> dict[str, list[str]]:
    """The members of each group the broker describes, as `client_id@host`; {} where it
    does not. Tansu marks its answer with authorized operations kafka-python's parser
    refuses (even when not asked for them), so there the request is sent again and its
    answer read as it came."""
    if not groups:
        return {}
    try:
        described = admin.describe_groups(groups)
        return {
            group: [_member(m["client_id"], m["client_host"]) for m in about["members"]]
            for group, about in described.items()
        }
    except ValueError:  # "15 is not a valid ACLOperation": Tansu's answer
        pass
    except Exception:  # a broker that does not describe groups: members not told
        return {}
    try:
        return _members_as_answered(admin, groups)
    except Exception:  # kafka-python's internals moved: members not told
        return {}


def _member(client_id: str, host: str) -> str:
    return f"{client_id}@{host.lstrip('/')}"


def _members_as_answered(admin, groups: list[str]) -> dict[str, list[str]]:
    from kafka.protocol.admin import DescribeGroupsRequest

    async def describe() -> dict[str, list[str]]:
        members = {}
        coordinators = await admin._find_coordinator_ids(groups)
        for coordinator in set(coordinators.values()):
            asked = [group for group in groups if coordinators[group] == coordinator]
            request = DescribeGroupsRequest(groups=asked, include_authorized_operations=False)
            response = await admin._manager.send(request, node_id=coordinator)
            for group in response.groups:
                if not group.error_code:
                    members[group.group_id] = [
                        _member(m.client_id, m.client_host) for m in group.members
                    ]
        return members

    return admin._manager.run(describe)
