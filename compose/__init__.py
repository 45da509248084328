"""Deployment files, shipped in the wheel as package data so that an installed cronlog
needs no checkout: ``kafka/`` holds the native stack's pom, broker config template and
log config (read by ``connectors.stack.kafka``), ``systemd/`` the unit files and
``docker-compose.yml`` the Docker alternative (see docs/operations.md)."""
