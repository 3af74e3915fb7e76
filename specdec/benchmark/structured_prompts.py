"""The requests of ``specdec bench``'s structured case: JSON-schema extraction and
classification, as apps send them, in Gemma's chat format.

Two sets of twelve requests, each request a prompt and the JSON schema its answer must
match (the same schema on every side: specdec's and llama-server's ``json_schema`` field).
A pass sends four of them (``PASS_REQUESTS``), each round of the bench the next four
(``pass_requests``): apps send new documents, not the same ones again, and a drafter that
remembers earlier answers (suffix decoding's corpus, llama-server's ngram-mod) would
otherwise be asked for answers it has already seen from the second round on, which is
recall, not speculation.
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
    "From: Priya Raman <priya.raman@lotus-textiles.example>\nDear sales, this is about "
    "order LT-4402 for our Chennai workshop: 20 cotton rolls and 2 cutting tables. We paid "
    "2310.00 in total. Please send the tracking number.\nRegards, Priya Raman",
    "From: Lars Nilsson <lars@fjord-coffee.example>\nHej, order FC-0918 to our cafe in "
    "Bergen: 6 bags of beans, 2 grinders and 30 paper cups. The total was 487.40. The "
    "grinders are missing from the box.\nLars Nilsson",
    "From: Grace Okafor <g.okafor@sunrise-clinic.example>\nHello, I need an update on order "
    "SC-3307 for the Lagos clinic: 4 examination lamps and 15 boxes of gloves, 968.25 in "
    "total. It was due last week.\nThank you, Grace Okafor",
    "From: Diego Herrera <diego.herrera@andes-bikes.example>\nHi, we received order "
    "AB-6615 in Santiago today: 3 mountain bikes and 7 helmets, total 3150.00. Everything "
    "is fine, but the invoice shows the wrong address.\nDiego Herrera",
    "From: Sophie Martin <sophie.martin@bluebird-books.example>\nGood afternoon, order "
    "BB-2290 for our Toronto bookshop (40 notebooks, 25 fountain pens and 5 display stands) "
    "came to 742.80. Could you split the invoice in two?\nBest wishes, Sophie Martin",
    "From: Ahmed Khalil <ahmed.khalil@oasis-hotels.example>\nGreetings, for order OH-8123 "
    "to our hotel in Dubai we ordered 50 bath towels, 50 pillows and 10 kettles. The total "
    "was 2895.60. Please confirm the shipping date.\nAhmed Khalil",
    "From: Nora Fischer <nora@fischer-garden.example>\nHi, order FG-5071 for the Vienna "
    "garden center: 12 clay pots and 9 watering cans, total 268.90. Two pots were broken "
    "on arrival. What should I do?\nNora Fischer",
    "From: Samuel Adeyemi <s.adeyemi@harbor-marine.example>\nHello team, order HM-1450 "
    "for our Cape Town yard: 2 outboard motors, 4 life jackets and 1 anchor. The total "
    "charged was 5420.00. When can we expect delivery?\nSamuel Adeyemi",
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
    "My package was marked as delivered yesterday but it is not at my door and my neighbours "
    "have not seen it. Please help.",
    "The invoice for March lists a premium plan, but I downgraded to the basic plan in "
    "February. Please correct it.",
    "I cannot log in anymore. The password reset e-mail never arrives, and I have checked "
    "the spam folder twice.",
    "Your delivery driver left the box in the rain and everything inside is soaked. This is "
    "unacceptable, I want a replacement immediately.",
    "Is it possible to add a second user to our company account, or do we need a new "
    "subscription for that?",
    "The export to PDF has been failing with an unknown error since this morning, and our "
    "whole team needs the reports for a meeting in one hour.",
    "Thanks for fixing the sync problem so quickly last week, it works perfectly now.",
    "I moved to a new flat. Can you update my shipping address before my next order goes "
    "out on Friday?",
)

SETS: Dict[str, Tuple[Request, ...]] = {
    "extract": tuple(Request(_turn(_EXTRACT + e), ORDER_SCHEMA) for e in _EMAILS),
    "classify": tuple(Request(_turn(_CLASSIFY + t), TICKET_SCHEMA) for t in _TICKETS),
}


#: requests per pass (a pass of round ``r`` sends group ``r`` of this many: ``pass_requests``)
PASS_REQUESTS = 4


def pass_requests(n_requests: int, rep: int, size: int = PASS_REQUESTS) -> range:
    """The indices of the requests round ``rep``'s passes send: the set's groups of ``size``
    in turn, starting again after the last (a set of at most ``size`` is one group), so
    that no round before the groups run out asks for an answer an earlier one got."""
    if n_requests <= size:
        return range(n_requests)
    g = rep % (n_requests // size)
    return range(g * size, (g + 1) * size)


def describe(name: str) -> str:
    """One line on a set (the text of its ``Prompt`` in the matrix)."""
    n = len(SETS[name])
    return (f"{n} {name} requests under a JSON schema, {min(n, PASS_REQUESTS)} a pass, new ones "
            "each round (structured_prompts.SETS)")
