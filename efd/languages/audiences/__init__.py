"""Audiences and computed traits: the query language (`parser`, on `lexer`'s tokens, with
`printer` to print a tree back) and its evaluator (`evaluate`)."""

from efd.languages.audiences.evaluate import (
    CompiledCondition,
    CompiledExpression,
    Event,
    Profile,
    compile_condition,
    compile_expression,
    evaluate_condition,
    evaluate_expression,
)
from efd.languages.audiences.parser import parse_condition, parse_expression
from efd.languages.audiences.printer import to_text
from efd.languages.audiences.tree import Condition, Expression, ParseError, Requirements

__all__ = [
    "CompiledCondition",
    "CompiledExpression",
    "Condition",
    "Event",
    "Expression",
    "ParseError",
    "Profile",
    "Requirements",
    "compile_condition",
    "compile_expression",
    "evaluate_condition",
    "evaluate_expression",
    "parse_condition",
    "parse_expression",
    "to_text",
]
