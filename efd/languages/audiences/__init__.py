"""Audiences and computed traits: the query language (lang) and its evaluator (evaluate)."""

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
from efd.languages.audiences.parser import (
    Condition,
    Expression,
    ParseError,
    Requirements,
    parse_condition,
    parse_expression,
)

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
]
