"""Command lists in ``--help`` that show each command's first sentence whole.

click cuts a subcommand's one-line help at the terminal's width with ``...``; kvroute's
summaries are a sentence each, so its groups wrap them instead (``HelpfulGroup``).
"""

from __future__ import annotations

import click

SHORT_HELP_LIMIT = 400
"""Characters of a command's first sentence shown in its group's ``--help`` (wrapped to the width)."""


class HelpfulGroup(click.Group):
    """A click group whose ``--help`` lists each subcommand with its first sentence, wrapped."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(SHORT_HELP_LIMIT)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
