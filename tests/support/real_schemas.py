"""Twenty JSON schemas of the kind applications ask for, each with the request a user would
write: what a real instruct model, held to the schema, is to answer in a finished, valid
object (tests/engine/test_real_model.py)."""

from __future__ import annotations

from typing import Any


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STR, _INT, _NUM, _BOOL = ({"type": t} for t in ("string", "integer", "number", "boolean"))


def _list(items: dict[str, Any], low: int = 1, high: int = 5) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("a person named Alice who is 30 years old", _obj(["name", "age"], name=_STR, age=_INT)),
    ("the weather in Paris today",
     _obj(["city", "temperature_c", "sunny"], city=_STR, temperature_c=_NUM, sunny=_BOOL)),
    ("a book: its title, author and year",
     _obj(["title", "author", "year"], title=_STR, author=_STR, year=_INT)),
    ("three fruits", _obj(["fruits"], fruits=_list(_STR, 3, 3))),
    ("a product with a name, a price in dollars and whether it is in stock",
     _obj(["name", "price", "in_stock"], name=_STR, price=_NUM, in_stock=_BOOL)),
    ("a city and the country it is in", _obj(["city", "country"], city=_STR, country=_STR)),
    ("a movie with its title and release year",
     _obj(["title", "year"], title=_STR, year=_INT)),
    ("a recipe: its name and a list of ingredients",
     _obj(["name", "ingredients"], name=_STR, ingredients=_list(_STR))),
    ("an address with a street, a city and a postal code",
     _obj(["street", "city", "postal_code"], street=_STR, city=_STR, postal_code=_STR)),
    ("a colour and whether it is warm",
     _obj(["colour", "warm"], colour={"enum": ["red", "orange", "yellow", "green", "blue"]},
          warm=_BOOL)),
    ("a to-do item with a title, a priority from 1 to 5 and whether it is done",
     _obj(["title", "priority", "done"], title=_STR,
          priority={"type": "integer", "minimum": 1, "maximum": 5}, done=_BOOL)),
    ("a student with a name and a list of grades",
     _obj(["name", "grades"], name=_STR, grades=_list(_INT))),
    ("an animal: its name, its number of legs and whether it can fly",
     _obj(["animal", "legs", "flies"], animal=_STR, legs=_INT, flies=_BOOL)),
    ("a planet and its distance from the sun in millions of kilometres",
     _obj(["planet", "distance_million_km"], planet=_STR, distance_million_km=_NUM)),
    ("a user account with a username, an email and an age",
     _obj(["username", "email", "age"], username=_STR, email=_STR, age=_INT)),
    ("a song with its title and artist", _obj(["title", "artist"], title=_STR, artist=_STR)),
    ("a meeting with a topic, a day of the week and a list of attendees",
     _obj(["topic", "day", "attendees"], topic=_STR,
          day={"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]},
          attendees=_list(_STR))),
    ("a car with its make, model and year",
     _obj(["make", "model", "year"], make=_STR, model=_STR, year=_INT)),
    ("a country with its capital and population",
     _obj(["country", "capital", "population"], country=_STR, capital=_STR, population=_INT)),
    ("an order with an id, a list of items (each a name and a quantity) and a total",
     _obj(["order_id", "items", "total"], order_id=_STR,
          items=_list(_obj(["name", "quantity"], name=_STR, quantity=_INT)), total=_NUM)),
]  # fmt: skip
