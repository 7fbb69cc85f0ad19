"""JSON's own types for the models that travel in requests: what their OpenAPI schemas say is
exactly what validation takes (no "5" for a number, no 0 for a boolean, no blank for a string that
must say something). Plain pydantic, importing nothing of the project: the wire schemas
(:mod:`hoprl.schemas`) and the domain's travelling types (:class:`hoprl.domain.EpisodeShape`) use it.
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, StrictBool, StringConstraints
from pydantic_core import PydanticCustomError

#: a string holding at least one visible character: not only whitespace, NUL or other control
#: characters. A request field that must say something carries it as its OpenAPI ``pattern`` (with
#: ``minLength: 1``), so the published schema and the validation are one rule (the 422 says so in
#: words, :data:`VISIBLE_MESSAGE`). The class names every invisible character explicitly (C0 and C1
#: controls, space, no-break space, the Unicode spaces, zero-width space and BOM) rather than ``\s``,
#: whose meaning differs between Python's ``re``, the Rust regex pydantic validates with and
#: JavaScript (U+0085 is ``\s`` to one and not to another).
VISIBLE = r"[^\x00-\x20\x7f-\xa0\u1680\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]"
#: the message for a string that fails :data:`VISIBLE`
VISIBLE_MESSAGE = (
    "must hold at least one visible character (not only spaces or control characters such as NUL)"
)


def non_blank(max_length: int) -> StringConstraints:
    """The constraints of a request string that must say something, in 1 to ``max_length`` characters."""
    return StringConstraints(min_length=1, max_length=max_length, pattern=VISIBLE)


def json_number(value: Any) -> Any:
    """Refuse what JSON Schema does not call a number: a string ("5") or a boolean (true is 1 to
    Python). A whole float (5.0) is an ``integer`` to JSON Schema and stays accepted."""
    if isinstance(value, (str, bool)):
        raise PydanticCustomError(
            "number_type", "Input should be a JSON number, not {kind}", {"kind": type(value).__name__}
        )
    return value


#: request integers and floats: exactly JSON Schema's ``integer`` / ``number`` (5 and 5.0, never "5"
#: or true); pydantic's lax mode would turn "5" into 5 and true into 1, its strict mode refuse 5.0
Int = Annotated[int, BeforeValidator(json_number)]
Float = Annotated[float, BeforeValidator(json_number)]
#: the largest integer a request may carry (2**53 - 1): the safe range of I-JSON (RFC 7493, 2.2),
#: which every JSON parser, and every client or fuzzer that holds numbers as doubles, reads exactly.
#: A bound of 2**63 - 1 printed in OpenAPI is read back as the double 2**63 by such tools, so the
#: published maximum and the enforced one drifted apart by one.
MAX_JSON_INT = 2**53 - 1
#: request booleans: true or false only (lax mode would take 0, 1, "yes")
Bool = StrictBool


def _scalar_kinds(annotation: Any) -> set[type]:
    """The JSON scalar kinds an annotation is made of (None ignored): {bool}, {int, float}, ... ;
    empty when anything else (a string, a list, a model) is among them."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    kinds = {a for a in args if a is not type(None)}
    return kinds if kinds and kinds <= {bool, int, float} else set()


def json_typed(model: type[BaseModel], data: Any) -> Any:
    """``data`` for ``model`` with each boolean and number field checked against JSON's types:
    a boolean field takes true or false only (not 0 or "yes"), a number field a JSON number only (not
    "5" or true; 5.0 for an integer stays, as JSON Schema has it). Pydantic's lax mode converts those
    quietly, and its strict mode refuses 5.0; call this from a ``model_validator(mode="before")``
    to make a model with many such fields enforce exactly what its OpenAPI schema says."""
    if not isinstance(data, dict):
        return data
    for name, value in data.items():
        field = model.model_fields.get(name)
        kinds = _scalar_kinds(field.annotation) if field is not None else set()
        if not kinds or value is None:
            continue
        if kinds == {bool} and not isinstance(value, bool):
            raise PydanticCustomError(
                "bool_type",
                "{field}: Input should be true or false, not {value}",
                {"field": name, "value": repr(value)},
            )
        if bool not in kinds and (isinstance(value, (str, bool)) or not isinstance(value, (int, float))):
            raise PydanticCustomError(
                "number_type",
                "{field}: Input should be a JSON number, not {value}",
                {"field": name, "value": repr(value)},
            )
    return data
