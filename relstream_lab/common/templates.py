"""The benchmark's relQuery templates: five query types (paper §5.1) per dataset.

Each instruction comes before the row's values so that requests of one relQuery share
a prefix, as in the paper's templates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import relstream

# Output limits per query type (paper §5.1).
MAX_TOKENS = {"filter": 5, "classification": 10, "rating": 5, "summarization": 50, "open": 100}
QUERY_TYPES = tuple(MAX_TOKENS)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    filename: str
    templates: dict[str, str]


PAPER_DATASETS = (
    DatasetSpec(
        "beer",
        "ratebeer.csv",
        {
            "filter": "Decide whether this reviewer would buy the beer again. Answer Yes or No "
            "only.\nBeer: {beer/name} ({beer/style}, {beer/ABV}% ABV)\nReview: {review/text}",
            "classification": "Classify the reviewer's overall sentiment as Positive, Negative "
            "or Mixed. Answer with one word.\nBeer: {beer/name}\nReview: {review/text}",
            "rating": "Predict the reviewer's overall score for the beer on a scale of 1 to 5. "
            "Output only the digit.\nBeer: {beer/name} ({beer/style})\nAroma: "
            "{review/aroma}, taste: {review/taste}\nReview: {review/text}",
            "summarization": "Summarise the review in at most 20 words, naming the beer's "
            "strongest quality.\nBeer: {beer/name}\nReview: {review/text}",
            "open": "Which foods would pair well with this beer, and why? Base your answer on "
            "the review.\nBeer: {beer/name} ({beer/style})\nReview: {review/text}",
        },
    ),
    DatasetSpec(
        "movies",
        "movies_sample.csv",
        {
            "filter": "Decide whether this movie is suitable for children under ten. Answer "
            "Yes or No only.\nTitle: {movietitle}\nSynopsis: {movieinfo}",
            "classification": "Classify the critic's review as Positive, Negative or Neutral. "
            "Answer with one word.\nTitle: {movietitle}\nReview: {reviewcontent}",
            "rating": "Predict the critic's rating of the movie from 1 to 5. Output only the "
            "digit.\nSynopsis: {movieinfo}\nReview: {reviewcontent}",
            "summarization": "Summarise the critic's opinion of the movie in at most 20 words."
            "\nTitle: {movietitle}\nReview: {reviewcontent}",
            "open": "Who is the most likely audience for this movie, and what would they "
            "enjoy about it?\nTitle: {movietitle}\nGenres: {genres}\nSynopsis: {movieinfo}",
        },
    ),
    DatasetSpec(
        "products",
        "products_sample.csv",
        {
            "filter": "Decide whether the customer mentions a defect in the product. Answer "
            "Yes or No only.\nProduct: {product_title}\nReview: {text}",
            "classification": "Classify the sentiment of the review as Positive, Negative or "
            "Neutral. Answer with one word.\nReview title: {review_title}\nReview: {text}",
            "rating": "Predict the star rating (1 to 5) the customer gave. Output only the "
            "digit.\nProduct: {product_title}\nReview: {text}",
            "summarization": "Summarise the customer's review in at most 20 words.\nProduct: "
            "{product_title}\nDescription: {description}\nReview: {text}",
            "open": "What could the seller change to make this customer happier? Answer from "
            "the review.\nProduct: {product_title}\nDescription: {description}\nReview: {text}",
        },
    ),
    DatasetSpec(
        "pdmx",
        "pdmx_sample.csv",
        {
            "filter": "Decide whether this piece is likely a classical work. Answer Yes or No "
            "only.\nTitle: {title}\nComposer: {composername}\nTags: {tags}",
            "classification": "Classify the piece's genre as Classical, Pop, Folk, Jazz, Film "
            "or Other. Answer with one word.\nTitle: {title}\nArtist: {artistname}",
            "rating": "Predict how difficult this piece is to play, from 1 (easy) to 5 (hard). "
            "Output only the digit.\nTitle: {title}\nSong: {songname}\nArtist: {artistname}",
            "summarization": "Describe this score in at most 20 words for a music library "
            "catalogue.\nTitle: {title}\nSong: {songname}\nArtist: {artistname}\nPublisher: "
            "{publisher}",
            "open": "Who are the most likely players of this score, and on what occasions "
            "would they play it?\nTitle: {title}\nSong: {songname}\nArtist: {artistname}\n"
            "Genres: {genres}",
        },
    ),
)

BUNDLED_DATASET = DatasetSpec(
    "sample",
    str(Path(relstream.__file__).resolve().parent / "data" / "sample_reviews.csv"),
    {
        "filter": "Decide whether the review reports a product defect. Answer Yes or No "
        "only.\nProduct: {product}\nReview: {review}",
        "classification": "Classify the review's sentiment as Positive, Negative or Mixed. "
        "Answer with one word.\nReview: {review}",
        "rating": "Predict the star rating (1 to 5) the reviewer gave. Output only the "
        "digit.\nProduct: {product}\nReview: {review}",
        "summarization": "Summarise the review in at most 15 words.\nProduct: {product}\n"
        "Review: {review}",
        "open": "What should the maker of this product improve? Answer from the review."
        "\nProduct: {product} ({category})\nReview: {review}",
    },
)
