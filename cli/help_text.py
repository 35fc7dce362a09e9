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

    def command_summary(self, ctx: click.Context, name: str) -> str | None:
        """The first sentence of subcommand ``name``'s help, or None to leave it out (hidden)."""
        command = self.get_command(ctx, name)
        if command is None or command.hidden:
            return None
        return command.get_short_help_str(SHORT_HELP_LIMIT)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, text) for name in self.list_commands(ctx)
                if (text := self.command_summary(ctx, name)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
