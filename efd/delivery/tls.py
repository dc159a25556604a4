"""The TLS of efd's outbound requests: the receiver's certificate verified (the system's CAs,
and `delivery.ca_file`), and a hook's client certificate presented (mTLS); the check of a
client certificate and its key when the configuration loads.

Errors name files and say what is wrong with them, never what they hold.
"""

from __future__ import annotations

import hashlib
import ssl

from efd.segment.webhooks import ClientCert


class ClientCertError(ValueError):
    """A client certificate or key that cannot be used; the message names the file."""


class _Encrypted(Exception):
    """Raised by the password callback: an encrypted key would otherwise make OpenSSL ask
    for a passphrase on the terminal."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def verifying(ca_file: str | None) -> ssl.SSLContext:
    """Receivers' certificates verified, names checked, against the system's CAs and
    `ca_file`'s."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def presenting(client: ClientCert, ca_file: str | None) -> ssl.SSLContext:
    """As `verifying`, and presenting `client`'s certificate. Reads the files as they are
    now; ClientCertError if they no longer hold a certificate and its key."""
    context = verifying(ca_file)
    _load_chain(context, client.cert, client.key)
    return context


def unreadable(path: str) -> str | None:
    """Why efd cannot read the file at `path`, if it cannot."""
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as error:
        return f"cannot read {path}: {error.strerror or type(error).__name__}"
    return None


def check(cert: str, key: str | None) -> ClientCert:
    """The client certificate in `cert` and its private key, in `key` or, when `key` is None,
    in `cert` too: both readable, both PEM, the key the certificate's, and not encrypted.
    ClientCertError saying what is wrong."""
    content = b""
    for path in (cert, key):
        if path is None:
            continue
        try:
            with open(path, "rb") as file:
                content += hashlib.sha256(file.read()).digest()
        except OSError as error:
            raise ClientCertError(
                f"cannot read {path}: {error.strerror or type(error).__name__}"
            ) from None
    _load_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key)
    return ClientCert(cert, key, hashlib.sha256(content).hexdigest())


def _load_chain(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    try:
        # OpenSSL says "PEM lib" whichever file it could not read: the certificate is read
        # on its own first, so that the error names the right one.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except ssl.SSLError:
        raise ClientCertError(f"{cert} holds no PEM certificate") from None
    except OSError as error:
        raise ClientCertError(
            f"cannot read {cert}: {error.strerror or type(error).__name__}"
        ) from None
    try:
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise ClientCertError(
            f"the private key in {key or cert} is encrypted: efd takes an unencrypted key, "
            "protected by the file's permissions"
        ) from None
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ClientCertError(
                f"the private key in {key or cert} is not the key of the certificate in {cert}"
            ) from None
        if key is None:
            raise ClientCertError(
                f"{cert} holds no PEM private key: set client_key, or put the key in this file"
            ) from None
        raise ClientCertError(f"{key} holds no PEM private key") from None
    except OSError as error:  # the file went away since it was checked
        raise ClientCertError(
            f"cannot read {error.filename or cert}: {error.strerror or type(error).__name__}"
        ) from None
