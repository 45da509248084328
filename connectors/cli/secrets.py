"""`cronlog secrets list`: the secrets jobs may name, by name only (with the owners each
is granted to, for an admin). An owner's token lists the ones it may use."""

from __future__ import annotations

import typer

from connectors.api.service import ADMIN
from connectors.cli.access import open_service, use_mode
from connectors.cli.output import JsonOpt, print_json, print_table

secrets_app = typer.Typer(
    help="The secrets jobs may name (names only; the values stay on the workers).",
    no_args_is_help=True,
)
secrets_app.callback()(use_mode)


@secrets_app.command("list")
def secrets_list(as_json: JsonOpt = False) -> None:
    """The secrets you may name in a job's env (`{secret: NAME}`); as admin, every granted
    secret and the owner patterns it is granted to (CRONLOG_SECRETS_GRANTS)."""
    with open_service() as service:
        items = service.secrets(ADMIN)["items"]
    if as_json:
        print_json(items)
        return
    rows = [{**item, "owners": ", ".join(item.get("owners", []))} for item in items]
    print_table(rows, ["name", "owners"] if any("owners" in i for i in items) else ["name"])
