"""``python -m ntbridge.cli``: the ``ntbridge`` command."""

from . import command

command()
