"""Mappings: Segment's language for the bodies of Actions, `{"email": {"@path": "$.traits.email"}}`.

`compile` checks a mapping at load and names every problem by its key path; `apply` maps one
message and raises MappingError when it cannot. `values` holds JavaScript's rules the kit
follows (undefined, String(), truthiness, paths), `template` the `{{a.b}}` templates,
`directives` what each directive does to values. All of it is pure; the reference is
docs/actions.md, and Segment's @segment/actions-core is the one it is tested against.
"""

from efd.languages.mapping.compile import DIRECTIVES, Mapping, apply, compile
from efd.languages.mapping.values import MappingError

__all__ = ["DIRECTIVES", "Mapping", "MappingError", "apply", "compile"]
