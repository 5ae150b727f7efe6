"""The console's roles without a server: editors may write and edit, operators only write,
viewers neither; the open console has no editor; one name cannot hold two roles."""

from __future__ import annotations

import base64

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx_console.auth import ANONYMOUS, EDITOR, OPERATOR, VIEWER, Accounts


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_each_role_may_do_what_it_should() -> None:
    accounts = Accounts.from_lists(["op:a"], ["view:b"], ["ed:c"])
    op, viewer, editor = (
        accounts.authenticate(basic("op", "a")),
        accounts.authenticate(basic("view", "b")),
        accounts.authenticate(basic("ed", "c")),
    )
    assert op is not None and viewer is not None and editor is not None
    assert (op.role, viewer.role, editor.role) == (OPERATOR, VIEWER, EDITOR)
    assert [u.can_write for u in (op, viewer, editor)] == [True, False, True]
    assert [u.can_edit for u in (op, viewer, editor)] == [False, False, True]
    assert accounts.authenticate(basic("ed", "wrong")) is None


def test_the_open_console_has_no_editor() -> None:
    anonymous = Accounts.from_lists([], []).authenticate(None)
    assert anonymous is not None and anonymous.name == ANONYMOUS
    assert anonymous.can_write and not anonymous.can_edit


def test_an_editor_named_as_operator_too_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="given twice"):
        Accounts.from_lists(["ann:a"], [], ["ann:b"])
    with pytest.raises(ConfigurationError, match="--editor-auth/dlx_web_editors"):
        Accounts.from_lists([], [], ["no-password"])
