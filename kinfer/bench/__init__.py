"""`kinfer bench`: concurrency sweeps and the prefix scenario against kinfer or any OpenAI-style peer.

Layout: `stats` (the arithmetic), `prompts` (text of about N tokens), `clients` (one streaming driver
per dialect), `memory` (/metrics and process RSS), `sweep` and `prefix` (the two scenarios),
`servers` (start kinfer and peer servers on free ports), `report` (tables, bars, JSON).
"""
