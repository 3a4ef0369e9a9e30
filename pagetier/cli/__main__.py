"""``python -m pagetier.cli``: the pagetier command."""
from pagetier.cli import main

main()
