"""Edit and replay: change a buried message's payload or headers, see the diff, replay the copy.

:func:`plan_edit` builds the edited copy (the payload decoded exactly: JSON, a Celery JSON
message, protobuf of its best-fitting registered type; pickle and anything else refused).
:func:`edit` plans and, with ``replay``, publishes it as a replay
(:func:`celery_dlx.ops.replay.replay_copy`) and records it: the original obituary's replay
ledger, a ``replayed`` history entry naming the edit, and an ``edit`` audit entry. The original
obituary stays in the graveyard.

The edited copy is a new message: a new message id and, for a Celery task, a new task id (the
``id`` header, ``correlation_id``, and ``root_id`` when the task was its own root), so its result,
its events and its own failures are a new task's, never mixed with the run that died. It carries
``x-dlx-edited-from`` = the obituary id (and ``x-dlx-replayed``, as every replay).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from celery_dlx.codecs import ProtobufRegistry, decode_payload
from celery_dlx.codecs.result import KIND_CELERY, KIND_PROTOBUF, Decoded
from celery_dlx.ops import (
    BROKER_HEADER_PREFIXES,
    BROKER_HEADERS,
    Obituary,
    Outgoing,
    Runtime,
    obituaries,
)
from celery_dlx.ops.audit import audit_entries, record_audit
from celery_dlx.ops.replay import NotReplayed, check_target_queue, replay_copy, replay_one
from celery_dlx_edit.payload import (
    ABSENT,
    Change,
    EditedBody,
    EditError,
    diff_lines,
    edit_json,
    edit_protobuf,
    parse_protobuf,
    readable,
    refuse_unsafe,
    unwrap,
)

#: Header an edited copy carries: the id of the obituary it was edited from.
EDITED_FROM_HEADER = "x-dlx-edited-from"
#: The audit log's action name of an edit.
EDIT_ACTION = "edit"
#: Headers of a Celery task message an edit may not set: the edit gives them new values.
CELERY_ID_HEADERS = ("id", "root_id")


@dataclass
class EditPlan:
    """The edited copy of one obituary and what changed (nothing published yet)."""

    obituary_id: str
    queue: str
    kind: str
    type_name: str | None
    outgoing: Outgoing
    changes: list[Change]
    header_changes: list[Change]
    old_message_id: str
    new_message_id: str
    task_id: str | None = None
    replaced_payload: bool = False

    @property
    def paths(self) -> list[str]:
        return [c.path for c in self.changes]

    @property
    def header_names(self) -> list[str]:
        return [c.path for c in self.header_changes]

    def diff(self) -> list[str]:
        """The diff as text: one before/after pair per changed path and header."""
        lines = ["payload replaced from a file"] if self.replaced_payload else []
        return lines + diff_lines(self.changes, self.header_changes)


class EditJSON(TypedDict):
    """What ``celery dlx edit --json`` prints (and the console's ``POST /api/edit`` answers):
    the diff (``changes``, ``headers``: path, before, after, before_absent, after_absent) and
    whether the edited copy was ``replayed`` (never on a dry run)."""

    obituary_id: str
    queue: str
    to_queue: str | None
    kind: str
    type_name: str | None
    old_message_id: str
    new_message_id: str
    task_id: str | None
    payload_replaced: bool
    changes: list[dict[str, Any]]
    headers: list[dict[str, Any]]
    dry_run: bool
    replayed: bool
    at_ms: int | None
    audit_id: str | None


@dataclass
class EditReport:
    """What :func:`edit` did (or, without ``replay`` or on a dry run, would do)."""

    plan: EditPlan
    replayed: bool = False
    dry_run: bool = False
    to_queue: str | None = None
    at_ms: int = 0
    audit_id: str | None = None
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> EditJSON:
        p = self.plan
        return {
            "obituary_id": p.obituary_id,
            "queue": p.queue,
            "to_queue": self.to_queue,
            "kind": p.kind,
            "type_name": p.type_name,
            "old_message_id": p.old_message_id,
            "new_message_id": p.new_message_id,
            "task_id": p.task_id,
            "payload_replaced": p.replaced_payload,
            "changes": [c.to_json() for c in p.changes],
            "headers": [c.to_json() for c in p.header_changes],
            "dry_run": self.dry_run,
            "replayed": self.replayed,
            "at_ms": self.at_ms or None,
            "audit_id": self.audit_id,
        }


def check_header_name(name: str) -> str:
    """``name``, unless an edit may not set it.

    Raises:
        EditError: an empty name, or one of celery_dlx's ``x-dlx-*`` or the broker's
            ``x-death*`` headers.
    """
    clean = name.strip()
    if not clean:
        raise EditError("--header takes NAME=JSON with a non-empty NAME")
    lowered = clean.lower()
    if lowered.startswith("x-dlx-") or lowered.startswith(
        (*BROKER_HEADER_PREFIXES, *BROKER_HEADERS)
    ):
        raise EditError(
            f"header {clean!r} cannot be edited: x-dlx-* headers are celery_dlx's and x-death* "
            "the broker's (a replay sets them itself)"
        )
    return clean


def plan_edit(
    ob: Obituary,
    *,
    sets: Sequence[tuple[str, Any]] = (),
    headers: Sequence[tuple[str, Any]] = (),
    payload: bytes | None = None,
    registry: ProtobufRegistry | None = None,
    to_queue: str | None = None,
    new_id: str | None = None,
) -> EditPlan:
    """The edited copy of ``ob``, loaded with its payload (pure: nothing else read or published).

    Args:
        sets: ``(path, value)`` pairs applied to the decoded payload, in order.
        headers: ``(name, value)`` pairs; a value of None removes the header.
        payload: a whole new body (checked to decode as the original's content); ``sets`` are
            then applied to it.
        registry: protobuf types (the best-fitting one is used to encode back).
        to_queue: the queue the copy goes to (already checked), else the one it died in.
        new_id: the new message (and task) id; a random UUID when None.

    Raises:
        EditError: nothing to edit, an unsafe or undecodable body, a path or value that does not
            fit, a header an edit may not set.
    """
    if not sets and not headers and payload is None:
        raise EditError("nothing to edit: give --set PATH=JSON, --header NAME=JSON or --payload")
    original = ob.payload or b""
    refuse_unsafe(original, ob.content_type)
    decoded = _decode(ob, original, registry)
    why = readable(decoded.kind, decoded)
    if why is not None:
        raise EditError(f"obituary {ob.id}: {why}")
    body = original if payload is None else _checked_payload(ob, payload, decoded, registry)
    body, wrapping = unwrap(body, decoded if payload is None else _decode(ob, body, registry))
    is_celery = decoded.kind == KIND_CELERY
    protocol = (
        decoded.data.get("protocol") if is_celery and isinstance(decoded.data, dict) else None
    )
    new_id = new_id or str(uuid.uuid4())
    edited = _edit_body(ob, body, decoded, sets, registry, new_id if protocol == 1 else None)
    out = replay_copy(ob, to_queue=to_queue)
    out.body = wrapping.wrap(edited.body)
    header_changes = _edit_headers(out.headers, headers, is_celery)
    if protocol == 2 and out.body != original:
        header_changes += _argument_reprs(out.headers, edited.body)
    out.headers[EDITED_FROM_HEADER] = ob.id
    old_id = ob.message_id
    task_id = None
    if is_celery:
        task_id = new_id
        old_task = _text(ob.headers.get("id")) if protocol == 2 else _body_id(original)
        if protocol == 2:
            out.headers["id"] = new_id
            if _text(ob.headers.get("root_id")) in (None, old_task):
                out.headers["root_id"] = new_id
        if out.properties.get("correlation_id") in (None, old_task):
            out.properties["correlation_id"] = new_id
        old_id = old_task or old_id
    if "message_id" in out.properties or not is_celery:
        out.properties["message_id"] = new_id
    return EditPlan(
        obituary_id=ob.id,
        queue=to_queue or ob.queue,
        kind=decoded.kind,
        type_name=edited.type_name,
        outgoing=out,
        changes=edited.changes,
        header_changes=header_changes,
        old_message_id=old_id,
        new_message_id=new_id,
        task_id=task_id,
        replaced_payload=payload is not None,
    )


def editable(ob: Obituary, registry: ProtobufRegistry | None) -> str | None:
    """Why ``ob``'s message cannot be edited (pickle, wrapped, undecodable...), or None."""
    body = ob.payload or b""
    try:
        refuse_unsafe(body, ob.content_type)
    except EditError as exc:
        return str(exc)
    decoded = _decode(ob, body, registry)
    return readable(decoded.kind, decoded)


def _decode(ob: Obituary, body: bytes, registry: ProtobufRegistry | None) -> Decoded:
    return decode_payload(
        body,
        content_type=ob.content_type,
        content_encoding=ob.content_encoding,
        headers=ob.headers,
        registry=registry,
    )


def _checked_payload(
    ob: Obituary, payload: bytes, original: Decoded, registry: ProtobufRegistry | None
) -> bytes:
    refuse_unsafe(payload, ob.content_type)
    found = _decode(ob, payload, registry)
    why = readable(found.kind, found)
    if why is not None:
        raise EditError(f"--payload: {why}")
    if original.kind == KIND_PROTOBUF and original.type_name and registry is not None:
        parse_protobuf(unwrap(payload, found)[0], original.type_name, registry)
    elif found.kind != original.kind:
        raise EditError(
            f"--payload: the new body reads as {found.kind} but the message is {original.kind} "
            f"(content type {ob.content_type or 'none'})"
            + (": " + "; ".join(found.notes) if found.notes else "")
        )
    return payload


def _edit_body(
    ob: Obituary,
    body: bytes,
    decoded: Decoded,
    sets: Sequence[tuple[str, Any]],
    registry: ProtobufRegistry | None,
    p1_task_id: str | None,
) -> EditedBody:
    if decoded.kind == KIND_PROTOBUF:
        if registry is None or not decoded.type_name:
            raise EditError("a protobuf body is edited with its registered type: none is known")
        if not sets:
            return EditedBody(KIND_PROTOBUF, body, [], decoded.type_name)
        return edit_protobuf(body, decoded.type_name, registry, sets)
    if not sets and p1_task_id is None:
        return EditedBody(decoded.kind, body, [])
    return edit_json(body, decoded.kind, sets, ob.headers, task_id=p1_task_id)


def _edit_headers(
    current: dict[str, Any], edits: Sequence[tuple[str, Any]], is_celery: bool
) -> list[Change]:
    changes = []
    for raw_name, value in edits:
        name = check_header_name(raw_name)
        if is_celery and name in CELERY_ID_HEADERS:
            raise EditError(
                f"header {name!r} cannot be edited: an edited Celery task gets a new task id"
            )
        before = current.get(name, ABSENT)
        if value is None:
            current.pop(name, None)
            changes.append(Change(name, _safe(before), ABSENT))
        else:
            current[name] = value
            changes.append(Change(name, _safe(before), value))
    return changes


#: Longest ``argsrepr``/``kwargsrepr`` written (Celery's default ``argsrepr_maxsize``).
REPR_LIMIT = 1024


def _argument_reprs(current: dict[str, Any], body: bytes) -> list[Change]:
    """Celery's display headers ``argsrepr``/``kwargsrepr`` (what Flower and the worker log
    show) rewritten from the edited arguments, where the message had them."""
    try:
        args, kwargs, _embed = json.loads(body)
    except ValueError:
        return []
    changes = []
    for name, value in (("argsrepr", repr(tuple(args))), ("kwargsrepr", repr(kwargs))):
        value = value[:REPR_LIMIT]
        before = current.get(name, ABSENT)
        if before is ABSENT or _text(before) == value:
            continue
        current[name] = value
        changes.append(Change(name, _safe(before), value))
    return changes


def _safe(value: Any) -> Any:
    if value is ABSENT:
        return ABSENT
    return json.loads(json.dumps(value, default=_text))


def _text(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return None if value is None else str(value)


def _body_id(body: bytes) -> str | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return _text(value.get("id")) if isinstance(value, Mapping) else None


def edit(
    runtime: Runtime,
    ident: str,
    *,
    sets: Sequence[tuple[str, Any]] = (),
    headers: Sequence[tuple[str, Any]] = (),
    payload: bytes | None = None,
    registry: ProtobufRegistry | None = None,
    replay: bool = False,
    dry_run: bool = False,
    to_queue: str | None = None,
    user: str = "",
    role: str = "cli",
) -> EditReport:
    """Edit obituary ``ident`` (an obituary id or message id) and, with ``replay``, publish the
    edited copy and record the edit.

    Without ``replay``, or with ``dry_run``, only the plan (the diff) is returned: nothing is
    published or recorded.

    Raises:
        DLXError: no such obituary, ``to_queue`` does not exist (checked on dry runs too), or an
            :class:`EditError` of :func:`plan_edit`. A copy the broker did not confirm raises
            too (nothing recorded).
    """
    ob = obituaries.get_obituary(runtime, ident)
    if ob is None:
        raise EditError(f"no obituary with id or message id {ident!r}")
    if to_queue is not None:
        to_queue = check_target_queue(runtime, to_queue)
    plan = plan_edit(
        ob, sets=sets, headers=headers, payload=payload, registry=registry, to_queue=to_queue
    )
    report = EditReport(plan, dry_run=dry_run, to_queue=to_queue)
    if not replay or dry_run:
        return report
    reason, extra = _replayed_entry(ob, plan, user or "?")
    try:
        at = replay_one(runtime, ob, plan.outgoing, to_queue=to_queue, reason=reason, extra=extra)
    except NotReplayed as exc:
        detail = f"{exc} (queue {plan.queue!r} missing?)" if exc.refused else str(exc)
        raise EditError(f"edited copy of {ob.id} not replayed: {detail}") from exc.__cause__
    report.replayed = True
    report.at_ms = at
    report.audit_id = _audit(runtime, ob, plan, at, user or "?", role)
    return report


def _replayed_entry(ob: Obituary, plan: EditPlan, user: str) -> tuple[str, dict[str, object]]:
    """The reason and extra fields of the edited copy's ``replayed`` history entry."""
    what = ", ".join(plan.paths + [f"header {h}" for h in plan.header_names])
    if plan.replaced_payload:
        what = "payload replaced" + (f", {what}" if what else "")
    reason = (
        f"edited ({what}) by {user} and replayed from obituary {ob.id} as message "
        f"{plan.new_message_id}"
    )
    extra: dict[str, object] = {
        "obituary_id": ob.id,
        "keep_attempts": False,
        "forced": True,
        "edited": True,
        "edited_by": user,
        "edited_paths": plan.paths,
        "edited_headers": plan.header_names,
        "payload_replaced": plan.replaced_payload,
        "new_message_id": plan.new_message_id,
    }
    if plan.queue != ob.queue:
        reason += f" to queue {plan.queue} (died in {ob.queue})"
        extra.update(from_queue=ob.queue, to_queue=plan.queue)
    return reason, extra


def _audit(runtime: Runtime, ob: Obituary, plan: EditPlan, at: int, user: str, role: str) -> str:
    """The ``edit`` entry of the audit log (the console's audit page shows CLI edits too)."""
    params = {
        "queue": ob.queue,
        "cause": ob.cause,
        "paths": plan.paths,
        "headers": plan.header_names,
        "payload_replaced": plan.replaced_payload,
        "to_queue": plan.queue if plan.queue != ob.queue else None,
    }
    result = {
        "new_message_id": plan.new_message_id,
        "task_id": plan.task_id,
        "changes": [c.to_json() for c in plan.changes],
        "headers": [c.to_json() for c in plan.header_changes],
    }
    what = ", ".join(plan.paths + [f"header {h}" for h in plan.header_names]) or "payload"
    summary = f"edited {what}; replayed as message {plan.new_message_id}"
    fields = {
        "at_ms": str(at),
        "user": user,
        "role": role,
        "action": EDIT_ACTION,
        "target": ob.id,
        "params": json.dumps(params, sort_keys=True, default=str),
        "status": "done",
        "summary": summary,
        "result": json.dumps(result, sort_keys=True, default=str)[:100_000],
        "job": "",
    }
    return record_audit(
        runtime,
        fields,
        queue=ob.queue,
        cause=ob.cause,
        message_id=f"audit:edit:{ob.id}",
        reason=f"{user} ({role}) {EDIT_ACTION} {ob.id}: {summary}",
        at_ms=at,
    )


def edits_of(runtime: Runtime, obituary_id: str, *, scan: int = 1000) -> list[dict[str, object]]:
    """The edits recorded for ``obituary_id`` among the latest ``scan`` audit entries, newest
    first: when, who, which paths and headers, the new message id."""
    out = []
    for entry_id, fields in audit_entries(runtime, scan):
        if fields.get("action") != EDIT_ACTION or fields.get("target") != obituary_id:
            continue
        params, result = fields["params"], fields["result"]
        out.append(
            {
                "id": entry_id,
                "at_ms": int(fields.get("at_ms") or 0),
                "user": fields.get("user", ""),
                "role": fields.get("role", ""),
                "paths": params.get("paths", []),
                "headers": params.get("headers", []),
                "payload_replaced": bool(params.get("payload_replaced")),
                "to_queue": params.get("to_queue"),
                "new_message_id": result.get("new_message_id"),
            }
        )
    return out
