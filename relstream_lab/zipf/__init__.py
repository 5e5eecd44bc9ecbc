"""The Zipf benchmark: a stream that repeats itself, with and without each mechanism."""
