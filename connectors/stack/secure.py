"""The secured local broker (`cronlog stack up --secure`): TLS and SCRAM on the client
listener, one user per role, the StandardAuthorizer with cronlog's ACLs.

What it makes, once, under ``<state>/kafka-secure/tls`` (every file 0600):
- a local certificate authority (``ca.pem``) and the broker's certificate for 127.0.0.1
  and localhost, signed by it, in a PKCS#12 keystore (openssl);
- a random password per role user (``users.json``) and, per role, the client properties
  a process of that role is given as ``CRONLOG_KAFKA_CONFIG`` (``<role>.properties``:
  SASL_SSL, SCRAM-SHA-512, its user, the CA).

The broker: ``SASL_SSL`` on the client port (also between brokers, as the admin user);
the controller quorum on loopback with SASL PLAIN (KRaft controllers cannot use SCRAM:
its credentials live in the metadata they serve); SCRAM users created when the storage is
formatted (`--add-scram`), so the broker can authenticate from its first start. Only
the admin user is a super user; every other user gets exactly the ACLs of its role
(connectors/stack/acls.py), and a resource without an ACL is denied.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from connectors.private_files import write_private
from connectors.stack.acls import ROLES, Grant
from connectors.stack.process import Log, StackError
from streams.settings import Settings

MECHANISM = "SCRAM-SHA-512"


def username(role: str) -> str:
    return f"cronlog-{role}"


@dataclass(frozen=True, slots=True)
class SecureMaterial:
    dir: Path
    passwords: dict[str, str]  # role -> password
    keystore_password: str

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.dir / "broker.p12"

    def properties_file(self, role: str) -> Path:
        return self.dir / f"{role}.properties"

    def client_properties(self, role: str) -> dict[str, str]:
        """librdkafka's names, as CRONLOG_KAFKA_CONFIG takes them."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": username(role),
            "sasl.password": self.passwords[role],
            "ssl.ca.location": str(self.ca),
        }


def _openssl(args: list[str], what: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise StackError("openssl is needed for --secure: apt-get install openssl") from None
    except subprocess.CalledProcessError as exc:
        detail = exc.stderr.decode(errors="replace").strip()
        raise StackError(f"openssl could not {what}: {detail}") from None


def _private(path: Path, text: str) -> None:
    """Written 0600 from its first byte (a new file renamed over the old one): a reader
    of an older, wider file never sees the new passwords."""
    write_private(path, text)


def ensure_material(directory: Path, log: Log = print) -> SecureMaterial:
    """The CA, the broker's keystore, the users' passwords and the client properties;
    made once and reused (a second `up` changes nothing)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    users_file = directory / "users.json"
    if users_file.exists():
        saved = json.loads(users_file.read_text())
    else:
        saved = {
            "keystore": secrets.token_urlsafe(18),
            "users": {role: secrets.token_urlsafe(24) for role in ROLES},
        }
        _private(users_file, json.dumps(saved, indent=2) + "\n")
    material = SecureMaterial(directory, dict(saved["users"]), saved["keystore"])
    missing = [r for r in ROLES if r not in material.passwords]
    if missing:
        raise StackError(f"{users_file} has no password for {', '.join(missing)}")
    if not material.keystore.exists():
        log(f"making a local CA and the broker's certificate in {directory}")
        os.umask(0o077)
        ca_key, key = directory / "ca.key", directory / "broker.key"
        csr, crt = directory / "broker.csr", directory / "broker.crt"
        _openssl(
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-subj", "/CN=cronlog local CA", "-keyout", str(ca_key), "-out", str(material.ca)],
            "make the CA",
        )  # fmt: skip
        _openssl(
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", str(key), "-out", str(csr)],
            "make the broker's key",
        )  # fmt: skip
        extensions = directory / "san.ext"
        extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl(
            ["x509", "-req", "-in", str(csr), "-CA", str(material.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "3650", "-extfile", str(extensions), "-out", str(crt)],
            "sign the broker's certificate",
        )  # fmt: skip
        _openssl(
            ["pkcs12", "-export", "-in", str(crt), "-inkey", str(key), "-certfile",
             str(material.ca), "-name", "broker", "-out", str(material.keystore),
             "-passout", f"pass:{material.keystore_password}"],
            "write the broker's keystore",
        )  # fmt: skip
        material.ca.chmod(0o644)  # public: every client is given it
    for role in ROLES:
        lines = [f"{k}={v}" for k, v in material.client_properties(role).items()]
        _private(material.properties_file(role), "\n".join(lines) + "\n")
    return material


def listener_config(material: SecureMaterial, port: int, controller_port: int) -> str:
    """The listener and security block of a secured node's server.properties."""
    admin, password = username("admin"), material.passwords["admin"]
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{admin}" password="{password}" user_{admin}="{password}";'
    )
    scram = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{admin}" password="{password}";'
    )
    return "\n".join(
        [
            f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            "sasl.mechanism.controller.protocol=PLAIN",
            f"listener.name.sasl_ssl.sasl.enabled.mechanisms={MECHANISM}",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={plain}",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.location={material.keystore}",
            f"ssl.keystore.password={material.keystore_password}",
            f"ssl.key.password={material.keystore_password}",
            # The broker is also a client (between brokers): it trusts the local CA.
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={material.ca}",
            "ssl.client.auth=none",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{admin}",
            "allow.everyone.if.no.acl.found=false",
        ]
    )


def scram_format_args(material: SecureMaterial) -> list[str]:
    """`kafka-storage format` arguments creating every role's SCRAM user (KIP-900)."""
    return [
        f"--add-scram={MECHANISM}=[name={username(role)},password={material.passwords[role]}]"
        for role in ROLES
    ]


def add_worker(material: SecureMaterial, admin: Settings, worker_id: str) -> Path:
    """Provision one native worker on the secured broker, as the admin user `admin`
    carries (its prefix is the installation's): a SCRAM user ``cronlog-worker-<id>``
    (its password kept in users.json, the same on a second call), its ACLs
    (`worker_grants`: the worker role's writes and its own inbox), its inbox topic, and
    its client properties file, which is returned. Repeating it changes nothing."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from connectors.stack.acls import worker_grants
    from streams.inboxes import ensure_private_inbox, private_inbox
    from streams.kafka import admin_config

    if private_inbox(admin, worker_id) is None:
        raise StackError(f"worker id {worker_id!r} cannot name an inbox topic")
    role = f"worker-{worker_id}"
    users_file = material.dir / "users.json"
    saved = json.loads(users_file.read_text())
    workers: dict[str, str] = saved.setdefault("workers", {})
    if worker_id not in workers:
        workers[worker_id] = secrets.token_urlsafe(24)
        _private(users_file, json.dumps(saved, indent=2) + "\n")
    password = workers[worker_id]
    client = AdminClient(admin_config(admin))
    upsert = UserScramCredentialUpsertion(
        username(role), ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for user, future in client.alter_user_scram_credentials([upsert]).items():
        try:
            future.result(timeout=30)
        except Exception as exc:  # noqa: BLE001 - named, with the user
            raise StackError(f"could not create the SCRAM user {user}: {exc}") from None
    apply_acls(admin, admin.topic_prefix, worker_grants(worker_id))
    ensure_private_inbox(admin, worker_id)
    props = {**material.client_properties("worker"), "sasl.username": username(role)}
    props["sasl.password"] = password
    path = material.properties_file(role)
    _private(path, "".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def apply_acls(settings: Settings, prefix: str, grants: Iterable[Grant] | None = None) -> int:
    """Create every role's ACLs (connectors/stack/acls.py) for one installation's prefix,
    as the admin user `settings` carries. Creating an ACL that exists changes nothing, so
    this is repeated safely (every `up`, a test's own prefix). Returns the entries."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from connectors.stack.acls import GRANTS, acls
    from streams.kafka import admin_config

    kinds = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional_id": ResourceType.TRANSACTIONAL_ID,
    }
    operations = {
        "read": AclOperation.READ,
        "write": AclOperation.WRITE,
        "create": AclOperation.CREATE,
        "describe": AclOperation.DESCRIBE,
    }
    bindings = [
        AclBinding(
            kinds[acl.resource],
            acl.name,
            ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
            acl.principal,
            "*",
            operations[acl.operation],
            AclPermissionType.ALLOW,
        )
        for acl in acls(prefix, grants=GRANTS if grants is None else grants)
    ]
    admin = AdminClient(admin_config(settings))
    for binding, future in admin.create_acls(bindings, request_timeout=30).items():
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001 - named, with the entry
            raise StackError(f"could not create the ACL {binding}: {exc}") from None
    return len(bindings)
