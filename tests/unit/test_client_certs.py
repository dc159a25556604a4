"""A hook's client certificate (mTLS) at configuration load: both files readable and PEM,
the key the certificate's, unencrypted; every problem named by its key, never a byte of
the key shown. Real files, from a CA made here."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from efd import config
from efd.delivery import tls
from efd.segment.webhooks import ClientCert

KEY = "destinations[0].hooks[0].client_cert"


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def files(tmp_path: Path, authority: trustme.CA) -> dict[str, Path]:
    """A client certificate and its key, apart and together, and another one's key."""
    mine, other = authority.issue_cert("client.example"), authority.issue_cert("other.example")
    paths = {
        "cert": tmp_path / "client.crt",
        "key": tmp_path / "client.key",
        "both": tmp_path / "client.pem",
        "other_key": tmp_path / "other.key",
        "garbage": tmp_path / "garbage.pem",
    }
    mine.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    mine.private_key_pem.write_to_path(str(paths["key"]))
    mine.private_key_and_cert_chain_pem.write_to_path(str(paths["both"]))
    other.private_key_pem.write_to_path(str(paths["other_key"]))
    paths["garbage"].write_text("not a certificate\n")
    return paths


def _config(tmp_path: Path, hook: str, url: str = "https://hooks.example.com/in") -> Path:
    path = tmp_path / "efd.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [[destinations]]
            name = "crm"
            [[destinations.hooks]]
            url = "{url}"
            """
        )
        + hook
    )
    return path


def _problems(tmp_path: Path, hook: str, url: str = "https://hooks.example.com/in") -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load(_config(tmp_path, hook, url))
    return caught.value.problems


def test_a_certificate_and_its_key_reach_the_route(tmp_path: Path, files: dict[str, Path]) -> None:
    hook = f'client_cert = "{files["cert"]}"\nclient_key = "{files["key"]}"\n'
    settings = config.load(_config(tmp_path, hook))
    route = settings.destinations[0].route("efd/1.0")
    client = route.client_certs["https://hooks.example.com/in"]
    assert (client.cert, client.key) == (str(files["cert"]), str(files["key"]))
    assert str(files["key"]) not in repr(route)


def test_a_combined_file_needs_no_client_key(tmp_path: Path, files: dict[str, Path]) -> None:
    settings = config.load(_config(tmp_path, f'client_cert = "{files["both"]}"\n'))
    client = settings.destinations[0].hooks[0].client
    assert client is not None
    assert (client.cert, client.key) == (str(files["both"]), None)


def test_hooks_without_a_certificate_present_none(tmp_path: Path) -> None:
    settings = config.load(_config(tmp_path, ""))
    assert settings.destinations[0].route("efd/1.0").client_certs == {}


def test_a_renewed_file_gives_another_client_cert(
    tmp_path: Path, files: dict[str, Path], authority: trustme.CA
) -> None:
    hook = f'client_cert = "{files["both"]}"\n'
    before = config.load(_config(tmp_path, hook)).destinations[0].hooks[0].client
    again = config.load(_config(tmp_path, hook)).destinations[0].hooks[0].client
    assert before == again  # unchanged files: the sender keeps its context
    authority.issue_cert("client.example").private_key_and_cert_chain_pem.write_to_path(
        str(files["both"])
    )
    renewed = config.load(_config(tmp_path, hook)).destinations[0].hooks[0].client
    assert renewed is not None
    assert before is not None
    assert renewed.cert == before.cert
    assert renewed != before


def test_a_key_that_is_not_the_certificates_is_refused(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    hook = f'client_cert = "{files["cert"]}"\nclient_key = "{files["other_key"]}"\n'
    [problem] = _problems(tmp_path, hook)
    assert problem == (
        f"{KEY}: the private key in {files['other_key']} is not the key of the certificate "
        f"in {files['cert']}"
    )


def _key_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if "-----" not in line]


@pytest.mark.parametrize(
    ("cert", "key", "where", "words"),
    [
        ("cert", "garbage", "client_cert", "garbage.pem holds no PEM private key"),
        ("cert", "cert", "client_cert", "client.crt holds no PEM private key"),
        ("garbage", "key", "client_cert", "garbage.pem holds no PEM certificate"),
        ("key", "key", "client_cert", "client.key holds no PEM certificate"),
        ("cert", None, "client_cert", "holds no PEM private key: set client_key"),
        ("missing", "key", "client_cert", "cannot read"),
        ("cert", "missing", "client_key", "cannot read"),
        ("cert", "directory", "client_key", "Is a directory"),
        ("directory", None, "client_cert", "Is a directory"),
        (None, "key", "client_cert", "required with client_key"),
    ],
)
def test_bad_files_name_the_key_and_the_reason(
    tmp_path: Path,
    files: dict[str, Path],
    cert: str | None,
    key: str | None,
    where: str,
    words: str,
) -> None:
    def path(name: str) -> Path:
        return tmp_path if name == "directory" else files.get(name, tmp_path / "missing.pem")

    hook = (f'client_cert = "{path(cert)}"\n' if cert else "") + (
        f'client_key = "{path(key)}"\n' if key else ""
    )
    [problem] = _problems(tmp_path, hook)
    assert problem.startswith(f"destinations[0].hooks[0].{where}: "), problem
    assert words in problem
    for line in _key_lines(files["key"]) + _key_lines(files["other_key"]):
        assert line not in problem


def test_an_unreadable_key_is_refused(tmp_path: Path, files: dict[str, Path]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    files["key"].chmod(0)
    hook = f'client_cert = "{files["cert"]}"\nclient_key = "{files["key"]}"\n'
    [problem] = _problems(tmp_path, hook)
    assert problem == (
        f"destinations[0].hooks[0].client_key: cannot read {files['key']}: Permission denied"
    )


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    key = serialization.load_pem_private_key(files["key"].read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    hook = f'client_cert = "{files["cert"]}"\nclient_key = "{encrypted}"\n'
    [problem] = _problems(tmp_path, hook)
    assert problem.startswith(f"{KEY}: the private key in {encrypted} is encrypted")


def test_a_client_certificate_needs_https(tmp_path: Path, files: dict[str, Path]) -> None:
    hook = f'client_cert = "{files["both"]}"\n'
    [problem] = _problems(tmp_path, hook, url="http://hooks.example.com/in")
    assert problem == f"{KEY}: a client certificate is presented over https:// only"


def test_every_hook_is_checked(tmp_path: Path, files: dict[str, Path]) -> None:
    path = _config(tmp_path, f'client_cert = "{files["cert"]}"\n')
    with path.open("a") as out:
        out.write(
            '[[destinations.hooks]]\nurl = "https://b.example.com/in"\n'
            f'client_cert = "{files["cert"]}"\nclient_key = "{files["other_key"]}"\n'
        )
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert [p.split(": ", 1)[0] for p in caught.value.problems] == [
        KEY,
        "destinations[0].hooks[1].client_cert",
    ]


def test_presenting_reads_the_files_as_they_are_now(tmp_path: Path, files: dict[str, Path]) -> None:
    client = tls.check(str(files["cert"]), str(files["key"]))
    assert tls.presenting(client, None) is not None
    files["key"].write_bytes(files["other_key"].read_bytes())
    with pytest.raises(tls.ClientCertError, match="is not the key of the certificate"):
        tls.presenting(client, None)
    gone = ClientCert(str(tmp_path / "gone.pem"), None, client.digest)
    with pytest.raises(tls.ClientCertError, match="cannot read"):
        tls.presenting(gone, None)
