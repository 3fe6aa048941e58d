"""The model store: KINFER_HOME layout, listing, name resolution, removal, pulls and model traits.

Start at `catalog.Store`; `models.StoredModel` is what it hands out, `inspect.describe` reads a
model's traits from its headers.
"""
