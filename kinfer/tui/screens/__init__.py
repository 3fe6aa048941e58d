"""Modal screens: the pull dialog and the delete confirmation."""
