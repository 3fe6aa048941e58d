"""Builders that tests and benchmark scripts share, so scripts never import `tests/`.

Nothing here runs on the serving path: each builds model files from weights already on the machine.
"""
