"""Your own Faust agent in the worker: reviews produced to the table `raw_reviews` are
filtered and enriched on their way to the table `reviews`, whose rows the worker windows.

    relstream worker --bootstrap 127.0.0.1:9092 --config queries.toml \\
        --agents docs/examples/enrich_reviews.py

A row whose review is empty or only spaces is dropped; the others get the review
trimmed and a `words` column (a template may use `{words}`). A message that is not a row
is passed on unchanged, so the window stage dead-letters it with the reason. Create the
input topic as the rows topics are created (`relstream broker --table raw_reviews
--table reviews`), and produce to it with `relstream produce --table raw_reviews`.

The agent runs under Faust's own acknowledgements: an event is committed once the agent
has handled it and the app's producer has flushed what it sent. It reads one event at a
time, Faust's way, which is much slower than the window stage (docs/architecture/stream.md,
"Why the window stage is not a Faust agent", which also says where Faust's
acknowledgements fall short).
"""

from relstream.wire import MessageError, RowMessage, decode, encode


def agents(app, topics) -> None:
    raw = app.topic(topics.rows("raw_reviews"), key_type=bytes, value_type=bytes)
    reviews = app.topic(topics.rows("reviews"), key_type=bytes, value_type=bytes)

    @app.agent(raw, name="enrich-reviews")
    async def enrich(stream):
        async for key, value in stream.items():
            try:
                row = decode(RowMessage, value)
            except MessageError:
                await reviews.send(key=key, value=value)  # the stage says what is wrong
                continue
            review = str(row.values.get("review") or "").strip()
            if not review:
                continue
            values = {**row.values, "review": review, "words": len(review.split())}
            enriched = RowMessage(table="reviews", key=row.key, values=values)
            await reviews.send(key=key, value=encode(enriched))
