"""The CLI's line for a 422 entry names the field, the message and the value sent
(docs: a clear error names the field and the value). Before, the value was dropped
(``action: Input should be 'none', …`` for ``--action rebot``), a field-less location
printed ``: Value error, …`` and a message naming its field doubled it."""
from __future__ import annotations

from workers.ops import validation_line


def test_the_value_sent_is_named() -> None:
    d = {"loc": ["body", "action"], "msg": "Input should be 'none', 'reboot' or 'remove'",
         "input": "rebot"}
    assert validation_line(d) == ("action: Input should be 'none', 'reboot' or 'remove' "
                                  "(got 'rebot')")


def test_a_location_without_a_field_and_pydantic_prefix() -> None:
    d = {"loc": ["body"], "msg": "Value error, for: '-2h' must be positive", "input": "-2h"}
    assert validation_line(d) == "body: for: '-2h' must be positive"


def test_a_message_naming_its_field_is_not_doubled() -> None:
    d = {"loc": ["query", "since"], "msg": "since: 'bogus' is not a time", "input": "bogus"}
    assert validation_line(d) == "since: 'bogus' is not a time"
