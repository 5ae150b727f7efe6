"""Who may use the console: HTTP Basic accounts with three roles, CSRF tokens, where it may listen.

Operators (``--basic-auth``/``dlx_web_basic_auth``) read, replay and purge; editors
(``--editor-auth``/``dlx_web_editors``) may do all that and also edit a buried message before
replaying it; viewers (``--viewer-auth``/``dlx_web_viewer_auth``) only read. Without any account
the console is open (everyone an operator, nobody an editor), which is allowed on a loopback
address only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from celery_dlx.errors import ConfigurationError

#: May read, replay and purge.
OPERATOR = "operator"
#: May only read.
VIEWER = "viewer"
#: May do what an operator may, and edit a message's payload and headers before replaying it.
EDITOR = "editor"
#: The user of a console without accounts (loopback only).
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class User:
    """An authenticated console user."""

    name: str
    role: str

    @property
    def can_write(self) -> bool:
        """May replay and purge (operators and editors)."""
        return self.role in (OPERATOR, EDITOR)

    @property
    def can_edit(self) -> bool:
        """May edit a message before replaying it (editors only)."""
        return self.role == EDITOR


def _digest(password: str) -> bytes:
    return hashlib.sha256(password.encode("utf-8")).digest()


@dataclass
class Accounts:
    """The console's users: name -> (password digest, role)."""

    users: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    @classmethod
    def from_lists(
        cls, operators: Iterable[str], viewers: Iterable[str], editors: Iterable[str] = ()
    ) -> Accounts:
        """Accounts of ``USER:PASSWORD`` strings (split at the first colon).

        Raises:
            ConfigurationError: an empty user or password, or one user named twice.
        """
        accounts = cls()
        for entries, role, option in (
            (operators, OPERATOR, "--basic-auth/dlx_web_basic_auth"),
            (viewers, VIEWER, "--viewer-auth/dlx_web_viewer_auth"),
            (editors, EDITOR, "--editor-auth/dlx_web_editors"),
        ):
            for entry in entries:
                user, sep, password = entry.partition(":")
                if not sep or not user or not password:
                    raise ConfigurationError(
                        f"{option} takes USER:PASSWORD (both non-empty), got {user!r}:..."
                    )
                if user in accounts.users:
                    raise ConfigurationError(
                        f"console user {user!r} is given twice (operators, editors and viewers need "
                        "distinct names)"
                    )
                accounts.users[user] = (_digest(password), role)
        return accounts

    @property
    def open(self) -> bool:
        """No account: everyone is an operator (allowed on loopback only)."""
        return not self.users

    def authenticate(self, authorization: str | None) -> User | None:
        """The user of an ``Authorization`` header, or None when it is missing or wrong."""
        if self.open:
            return User(ANONYMOUS, OPERATOR)
        if not authorization:
            return None
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, sep, password = decoded.partition(":")
        if not sep:
            return None
        known = self.users.get(name)
        # Compared even for unknown users, so a wrong name takes as long as a wrong password.
        expected, role = known if known is not None else (_digest(secrets.token_hex(8)), VIEWER)
        if hmac.compare_digest(expected, _digest(password)) and known is not None:
            return User(name, role)
        return None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, accounts: Accounts) -> None:
    """Refuse a non-loopback address for a console without credentials.

    Raises:
        ConfigurationError: ``host`` is not loopback and no account is configured.
    """
    if accounts.open and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to listen on {host!r} without credentials: the console can replay and "
            "purge messages. Give --basic-auth USER:PASSWORD (operators), --editor-auth "
            "USER:PASSWORD (editors) and/or --viewer-auth USER:PASSWORD (dlx_web_basic_auth / "
            "dlx_web_editors / dlx_web_viewer_auth), or listen on 127.0.0.1"
        )


class Csrf:
    """CSRF tokens: an HMAC of the user under a secret made when the console starts.

    HTTP Basic credentials are sent by the browser with any request, also a form posted from
    another site, so every POST must carry the token of its user (a form field, or the
    ``X-CSRF-Token`` header for the JSON API).
    """

    def __init__(self) -> None:
        self.secret = secrets.token_bytes(32)

    def token(self, user: User) -> str:
        message = f"{user.role}\x1f{user.name}".encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def valid(self, user: User, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.token(user), str(token))
