"""Segment Actions triggers: the subscription language that picks the messages an action
sends, e.g. `type = "track" and event = "Order Completed"`.

`parser` parses text into a tree (`lexer` cuts it into tokens, `printer` prints a tree back),
`evaluate` says whether a message matches it, with the semantics of Segment's evaluator. All of
it is pure. The reference is the "Triggers" section of docs/actions.md.
"""

from efd.languages.triggers.evaluate import matches
from efd.languages.triggers.parser import parse
from efd.languages.triggers.printer import to_trigger
from efd.languages.triggers.tree import Condition, Field, Trigger, TriggerError

__all__ = ["Condition", "Field", "Trigger", "TriggerError", "matches", "parse", "to_trigger"]
