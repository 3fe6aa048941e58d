"""The Textual dashboard: a client of the runtime that watches the scheduler and drives the store.

Nothing outside this package imports it except `kinfer.commands.serve` (lazily), so headless mode
never imports Textual. `kinfer.tui.app.run_dashboard` is the entry point.
"""
