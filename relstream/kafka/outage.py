"""The old path of `relstream.kafka.loglimit`, kept only while `placer.py` (being moved
into the placement package) still imports `RateLimited` from here: remove it with that
import."""

from relstream.kafka.loglimit import RateLimited

__all__ = ["RateLimited"]
