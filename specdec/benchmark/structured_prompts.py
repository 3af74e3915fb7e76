"""The requests of ``specdec bench``'s structured case: JSON-schema extraction and
classification, as apps send them, in Gemma's chat format.

Two sets of four requests, each request a prompt and the JSON schema its answer must
match (the same schema on every side: specdec's and llama-server's ``json_schema`` field).
``extract``: an order e-mail to turn into a record (the values are copied from the text,
the keys and punctuation are forced by the schema; bounds on lengths and counts keep a
small model from running on); ``classify``: a support ticket to label
(enums: after a label's first token the rest is forced). Schemas close their objects
(``additionalProperties: false``) so that both sides constrain to the same language.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

ORDER_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "maxLength": 60},
        "city": {"type": "string", "maxLength": 30},
        "order_id": {"type": "string", "maxLength": 12},
        "total": {"type": "number"},
        "items": {"type": "array", "maxItems": 4, "items": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 30},
                           "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["name", "quantity"], "additionalProperties": False}},
    },
    "required": ["customer", "email", "city", "order_id", "total", "items"],
    "additionalProperties": False,
}

TICKET_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "category": {"type": "string",
                     "enum": ["billing", "shipping", "technical", "account", "other"]},
        "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
        "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
        "needs_human": {"type": "boolean"},
    },
    "required": ["category", "priority", "sentiment", "needs_human"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Request:
    text: str
    schema: Dict[str, Any]


def _turn(user: str) -> str:
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


_EXTRACT = ("Extract the order from this e-mail as JSON with the fields customer, email, city, "
            "order_id, total and items (each item: name and quantity).\n\nE-mail:\n")

_EMAILS = (
    "From: Maria Gonzalez <maria.gonzalez@northwind.example>\nHello, I am writing from "
    "Seattle about order NW-20931. I ordered 2 espresso machines and 3 milk frothers, and "
    "the invoice total was 1249.50. Could you confirm the delivery date?\nBest, Maria Gonzalez",
    "From: Kenji Watanabe <k.watanabe@sakura-tools.example>\nGood morning. Our order "
    "ST-7741 (5 cordless drills, 5 spare batteries, 1 tool case) has not reached our "
    "Osaka office yet. The total charged was 890.00. Please advise.\nKenji Watanabe",
    "From: Amelie Laurent <amelie@laurent-bakery.example>\nBonjour, order LB-1183 for our "
    "shop in Lyon: 10 flour sacks and 4 baking trays, total 312.75. One tray arrived bent; "
    "can you send a replacement?\nMerci, Amelie Laurent",
    "From: Tom Becker <tom.becker@alpine-outdoor.example>\nHi team, I placed order AO-5520 "
    "for our Munich store: 8 hiking backpacks, 12 water bottles and 6 headlamps. The total "
    "came to 1675.20. When will it ship?\nThanks, Tom Becker",
)

_CLASSIFY = ("Classify this support ticket. Answer in JSON with category (billing, shipping, "
             "technical, account or other), priority (low, medium, high or urgent), "
             "sentiment (positive, neutral or negative) and needs_human (true or false)."
             "\n\nTicket:\n")

_TICKETS = (
    "I was charged twice for my subscription this month and nobody answers my e-mails. "
    "This is the third time I write. I want a refund today.",
    "The app crashes every time I open the settings page on my phone since the last update. "
    "I tried reinstalling it, it did not help.",
    "Just wanted to say the parcel arrived a day early and everything was perfectly packed. "
    "Thank you, great service!",
    "How do I change the e-mail address of my account? I could not find the option in my "
    "profile.",
)

SETS: Dict[str, Tuple[Request, ...]] = {
    "extract": tuple(Request(_turn(_EXTRACT + e), ORDER_SCHEMA) for e in _EMAILS),
    "classify": tuple(Request(_turn(_CLASSIFY + t), TICKET_SCHEMA) for t in _TICKETS),
}


def describe(name: str) -> str:
    """One line on a set (the text of its ``Prompt`` in the matrix)."""
    return f"{len(SETS[name])} {name} requests under a JSON schema (structured_prompts.SETS)"
