"""The count reconciler (invariant 6): recount posts from the edge-store, repair persistent drift.

`core` decides (pure), `probes` reads the stores and the consumers' progress, `actions` writes a
correction, `reconcile` runs the two readings and the settle wait between them. Nothing is
imported here: `likes --help` must not pay for the store drivers (import the module you use).
"""
