"""Per-module isolation on the one shared stack: a topic prefix and a database each."""

from __future__ import annotations

import re
import uuid

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from streams.kafka import admin_config
from streams.settings import Settings


def unique_name(module: str) -> str:
    """A short, unique, Kafka- and PostgreSQL-safe name for one test module."""
    stem = re.sub(r"[^a-z0-9]+", "_", module.rsplit(".", 1)[-1].lower()).strip("_")[:24]
    return f"t_{stem}_{uuid.uuid4().hex[:8]}"


def create_database(admin_url: str, name: str) -> tuple[str, str]:
    """Create a database (or, without CREATEDB, a schema) for one module.

    Returns (conninfo for the module, kind) where kind is "database" or "schema".
    """
    with psycopg.connect(admin_url, autocommit=True) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return make_conninfo(admin_url, dbname=name), "database"
        except errors.InsufficientPrivilege:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            options = f"{conninfo_to_dict(admin_url).get('options') or ''} -csearch_path={name}"
            return make_conninfo(admin_url, options=options.strip()), "schema"


def drop_database(admin_url: str, name: str, kind: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if kind == "database":
            drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
            try:
                conn.execute(drop + sql.SQL(" WITH (FORCE)"))
            except errors.InsufficientPrivilege:
                # FORCE cannot end an autovacuum worker (it runs as the superuser); the
                # plain drop cancels autovacuum itself, and test processes are gone by now.
                conn.execute(drop)
        else:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def delete_topics_with_prefix(settings: Settings, prefix: str, timeout_s: float = 30) -> None:
    """Delete every topic under the prefix."""
    admin = AdminClient(admin_config(settings))
    names = [t for t in admin.list_topics(timeout=timeout_s).topics if t.startswith(prefix)]
    if names:
        for future in admin.delete_topics(names, request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
