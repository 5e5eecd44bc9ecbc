"""Faust's own consumer with empty fetches held (`relstream.kafka.clients.idlefetch`).

The worker's window stages read through relstream's consumers, which hold empty fetches
on a broker that does not long-poll; Faust's consumer, made by Faust's aiokafka driver,
would still re-fetch in a loop on such a broker (noida-db, `relstream broker`'s default)
and burn most of a core while idle (docs/benchmarks/idle). This transport is Faust's
aiokafka one whose consumer holds its fetches the same way once started."""

from __future__ import annotations

from faust.transport.drivers import aiokafka as driver

from relstream.kafka.clients.idlefetch import EMPTY_FETCH_HOLD_S, hold_empty_fetches


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    async def on_start(self) -> None:
        await super().on_start()
        hold_empty_fetches(self._consumer._fetcher, EMPTY_FETCH_HOLD_S)


class _Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class HeldFetchTransport(driver.Transport):
    """Faust's aiokafka transport, its consumer's empty fetches held."""

    Consumer = _Consumer
