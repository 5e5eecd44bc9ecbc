"""Placement by load: which engine's partition a relQuery is written to, from the load
the engines report, not its key's hash (docs/operations.md, Scale-out).

One number travels here, an engine's outstanding work, with its prices and its
relQueries by size: measured by the engine's policy, reported on the metrics topic,
weighed by every producer of relQueries.

- `load.py`: `Load`, what an engine has yet to do, the one type that carries it from the
  policy to the placer, and the size classes it counts relQueries in. Pure.
- `choice.py`: `Placement`, the choice of an engine and partition from the engines'
  reports (`EngineLoad`), and the hash it falls back to. Pure: the simulator and the lab
  place with it too.
- `reports.py`: an engine's report (`LoadReportMessage` on the wire), signed, published
  every quarter second by the engine service.
- `book.py`: `LoadBook`, the reports a producer trusts and the partition they choose;
  a relQuery's `Demand`; the `placement` option.
- `readers.py`: `LoadReader` (kafka-python, for the client) and `AsyncLoadReader`
  (aiokafka, for the worker and the HTTP door) follow the metrics topic into a book.

The plug-in's writer of its policy's load stays where it runs, in vLLM's engine core
(`engine/core/loadwriter.py`). This package imports nothing here, so its pure modules
import without Kafka, vLLM or Faust.
"""
